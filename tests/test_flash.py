"""Flash attention kernels: splash (Pallas interpret mode on CPU) and cuDNN against xla.

The splash kernel that runs on TPUs is run here in Pallas interpret mode: same kernel
code, same masks and segment ids, same custom backward. cuDNN needs a GPU: its call is
checked here through the same `jax.nn.dot_product_attention` arguments with the XLA
implementation, and for real by `test_cudnn_matches_xla_on_gpu` (skipped without one).
"""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import fast_first, random_ids, tiny_config
from jaxencoder import Encoder
from jaxencoder.model import flash
from jaxencoder.model.attention import xla_attention
from jaxencoder.model.masks import make_attention_mask

B, L = 2, 12
MASK_BxL = jnp.array([[1] * L, [1] * 7 + [0] * (L - 7)], jnp.int32)


def _outputs_and_grads(cfg, ids, **kwargs):
  """Real rows of last_hidden_state and d(sum of real outputs)/d(params), at one init."""
  model = Encoder(cfg)
  params = jax.jit(Encoder(cfg.replace(attention_impl="xla")).init)(jax.random.key(0), ids)
  mask = kwargs.get("attention_mask", jnp.ones(ids.shape, jnp.int32))
  rows = kwargs.pop("rows_mask", mask)

  def loss(params):
    out = model.apply(params, ids, **kwargs).last_hidden_state
    real = out * rows[..., None]
    return jnp.sum(jnp.sin(real)), real

  (_, real), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return real, grads


def _assert_same(cfg_overrides, ids=None, atol=2e-5, **kwargs):
  ids = random_ids(1, (B, L)) if ids is None else ids
  cfg = tiny_config(pooling="mean", **cfg_overrides)
  ref, ref_grads = _outputs_and_grads(cfg.replace(attention_impl="xla"), ids, **kwargs)
  out, grads = _outputs_and_grads(cfg.replace(attention_impl="splash"), ids, **kwargs)
  np.testing.assert_allclose(out, ref, atol=atol)
  jax.tree.map(lambda g, r: np.testing.assert_allclose(g, r, atol=atol, rtol=1e-5), grads,
               ref_grads)


@pytest.mark.parametrize("overrides", fast_first([
    dict(), dict(position_embedding="rope"), dict(causal=True), dict(sliding_window=3),
    dict(causal=True, sliding_window=2, scan_layers=True)]),
    ids=["padding", "rope", "causal", "window", "causal-window-scan"])
def test_splash_matches_xla_outputs_and_gradients(overrides):
  _assert_same(overrides, attention_mask=MASK_BxL)


def test_splash_packed_segments_match_xla():
  segments = jnp.array([[1] * 5 + [2] * 4 + [3] * 3, [1] * 3 + [2] * 6 + [0] * 3], jnp.int32)
  _assert_same({}, segment_ids=segments, rows_mask=(segments > 0).astype(jnp.int32))


def test_splash_sparse_last_block_matches_xla():
  """MLM's sparse last block: queries are a gathered subset of rows (Q != L)."""
  ids = random_ids(3, (B, L))
  positions = jnp.array([[2, 5, 11], [0, 3, 6]], jnp.int32)
  cfg = tiny_config(pooling="cls")
  outs = []
  for impl in ("xla", "splash"):
    model = Encoder(cfg.replace(attention_impl=impl))
    variables = jax.jit(model.init)(jax.random.key(0), ids)
    outs.append(jax.jit(lambda v, m=model: m.apply(v, ids, attention_mask=MASK_BxL,
                                                    output_positions=positions))(variables))
  np.testing.assert_allclose(outs[1].last_hidden_state, outs[0].last_hidden_state, atol=2e-5)
  np.testing.assert_allclose(outs[1].pooled, outs[0].pooled, atol=2e-5)


def test_splash_under_a_mesh_runs_per_shard():
  """Under a (data, fsdp, tensor) mesh the kernel runs in shard_map, batch and heads split."""
  from jaxencoder.train.sharding import DEFAULT_RULES, make_mesh
  from jaxencoder.train.steps import mesh_context
  ids = random_ids(4, (8, L))
  mask = jnp.tile(MASK_BxL, (4, 1))
  cfg = tiny_config(pooling="mean")
  variables = jax.jit(Encoder(cfg).init)(jax.random.key(0), ids)
  apply = lambda impl: jax.jit(lambda v, x, m: Encoder(cfg.replace(attention_impl=impl)).apply(
      v, x, attention_mask=m).last_hidden_state)
  ref = apply("xla")(variables, ids, mask)
  with mesh_context(make_mesh((2, 2, 2)), DEFAULT_RULES):
    fn = apply("splash")
    assert "shard_map" in str(jax.make_jaxpr(fn)(variables, ids, mask))
    out = fn(variables, ids, mask)
  np.testing.assert_allclose(out * mask[..., None], ref * mask[..., None], atol=2e-5)


def test_splash_builds_no_dense_mask():
  """Padding reaches splash as segment ids: no [B, 1, L, L] boolean mask in the program."""
  ids = random_ids(5, (B, L))
  for impl, expected in (("xla", True), ("splash", False)):
    model = Encoder(tiny_config(attention_impl=impl))
    variables = jax.jit(model.init)(jax.random.key(0), ids)
    jaxpr = str(jax.make_jaxpr(lambda v, m=model: m.apply(v, ids, attention_mask=MASK_BxL))(
        variables))
    assert (f"bool[{B},1,{L},{L}]" in jaxpr) == expected, impl


@pytest.mark.parametrize("overrides,call,reason", [
    (dict(position_embedding="relative"), {}, "relative position bias"),
    (dict(), dict(output_attentions=True), "attention weights were requested"),
    (dict(attention_dropout_rate=0.1), dict(deterministic=False), "attention dropout is on"),
])
def test_splash_falls_back_to_xla_with_one_line(overrides, call, reason, caplog):
  ids = random_ids(6, (B, L))
  cfg = tiny_config(pooling="mean", **overrides)
  flash._explained.clear()
  outs = []
  for impl in ("xla", "splash"):
    model = Encoder(cfg.replace(attention_impl=impl))
    variables = model.init(jax.random.key(0), ids)
    with caplog.at_level(logging.WARNING, logger="jaxencoder.model.flash"):
      rngs = {"dropout": jax.random.key(1)} if call.get("deterministic") is False else None
      outs.append(model.apply(variables, ids, attention_mask=MASK_BxL, rngs=rngs, **call))
  lines = [r.getMessage() for r in caplog.records if reason in r.getMessage()]
  assert len(lines) == 1 and "using xla" in lines[0], caplog.text
  np.testing.assert_array_equal(outs[1].last_hidden_state, outs[0].last_hidden_state)
  if call.get("output_attentions"):
    assert outs[1].attentions[0].shape == (B, cfg.num_heads, L, L)


@pytest.mark.parametrize("impl", ["fused", "linear"])
def test_attention_dropout_is_never_skipped_silently(impl, caplog):
  """fused and linear have no attention dropout: in training with it on, fused's call runs
  xla (the same softmax, dropped) with one line, and linear (another model, no weights to
  drop) refuses it in one line naming the key."""
  ids = random_ids(7, (B, L))
  cfg = tiny_config(pooling="mean", attention_impl=impl)
  variables = Encoder(cfg).init(jax.random.key(0), ids)
  train = lambda c: Encoder(c).apply(variables, ids, attention_mask=MASK_BxL, deterministic=False,
                                     rngs={"dropout": jax.random.key(1)}).last_hidden_state
  dropping = cfg.replace(attention_dropout_rate=0.5)
  if impl == "linear":
    with pytest.raises(ValueError, match=r"^attention_impl='linear' cannot serve this call: "
                       r"attention dropout is on .*model.attention_dropout_rate=0\)"):
      train(dropping)
    return
  flash._explained.clear()
  with caplog.at_level(logging.WARNING, logger="jaxencoder.model.flash"):
    dropped = train(dropping)
  assert not np.allclose(dropped, train(cfg), atol=1e-3)
  np.testing.assert_array_equal(dropped, train(dropping.replace(attention_impl="xla")))
  assert [r.getMessage() for r in caplog.records if "attention dropout is on" in r.getMessage()]


# ---------------------------------------------------------------- choosing a kernel
@pytest.mark.parametrize("backend,expected", [("gpu", "cudnn"), ("tpu", "splash"),
                                              ("cpu", "xla")])
def test_auto_picks_the_backends_kernel(backend, expected, monkeypatch):
  monkeypatch.setattr(flash, "max_cudnn_head_dim", lambda: 256)
  cfg = tiny_config(attention_impl="auto", dtype="bfloat16")
  assert flash.plan_attention(cfg, backend=backend).impl == expected
  assert flash.plan_attention(cfg.replace(attention_impl="xla"), backend=backend).impl == "xla"


@pytest.mark.parametrize("overrides,reason", [
    (dict(dtype="float32"), "compute dtype is float32"),
    (dict(num_heads=8), "head_dim=4"),  # emb_dim 32 / 8 heads: not a multiple of 8
    (dict(sliding_window=4), "two-sided sliding window"),
])
def test_cudnn_obstacles_fall_back_with_reason(overrides, reason, monkeypatch, caplog):
  monkeypatch.setattr(flash, "max_cudnn_head_dim", lambda: 256)
  flash._explained.clear()
  cfg = tiny_config(attention_impl="cudnn", **{"dtype": "bfloat16", **overrides})
  with caplog.at_level(logging.WARNING, logger="jaxencoder.model.flash"):
    plans = [flash.plan_attention(cfg, backend="gpu") for _ in range(3)]
  assert {p.impl for p in plans} == {"xla"}
  assert len(caplog.records) == 1 and reason in caplog.records[0].getMessage()


def test_cudnn_serves_bf16_training_calls_on_gpu(monkeypatch):
  monkeypatch.setattr(flash, "max_cudnn_head_dim", lambda: 256)
  cfg = tiny_config(attention_impl="cudnn", dtype="bfloat16", causal=True, sliding_window=4)
  assert flash.plan_attention(cfg, backend="gpu").impl == "cudnn"
  assert flash.plan_attention(cfg, backend="gpu", sparse_queries=True).impl == "xla"
  assert flash.plan_attention(cfg.replace(causal=False, sliding_window=None), backend="gpu",
                              sparse_queries=True).impl == "cudnn"


# ---------------------------------------------------------------- the cuDNN call
@pytest.mark.parametrize("causal,window", [(False, None), (True, None), (True, 3)])
def test_cudnn_call_arguments_mean_our_mask(causal, window):
  """Key lengths, causal and the left window, as passed to cuDNN, mean the same as our
  [B, 1, L, L] mask (run through the same API with implementation='xla')."""
  q, k, v = (jax.random.normal(jax.random.key(i), (B, L, 2, 8)) for i in range(3))
  out = flash.cudnn_attention(q, k, v, MASK_BxL, causal=causal, sliding_window=window,
                              implementation="xla")
  mask = make_attention_mask(MASK_BxL, causal=causal, sliding_window=window)
  ref, _ = xla_attention(q, k, v, mask, None)
  real = MASK_BxL[:, :, None, None]
  np.testing.assert_allclose(out * real, ref * real, atol=1e-5)


def test_cudnn_refuses_left_padding_it_cannot_express():
  q = k = v = jnp.ones((2, 4, 1, 8))
  with pytest.raises(ValueError, match=r"rows \[1\] have a pad before a real token"):
    flash.cudnn_attention(q, k, v, jnp.array([[1, 1, 0, 0], [0, 1, 1, 1]]), causal=False,
                          sliding_window=None, implementation="xla")


def test_splash_kernel_matches_xla_on_long_unaligned_rows():
  """Lengths that are not multiples of 128 are padded to it; two blocks of 128 here."""
  q, k, v = (jax.random.normal(jax.random.key(i), (1, 200, 2, 16)) for i in range(3))
  key_mask = (jnp.arange(200) < 150).astype(jnp.int32)[None]
  seg = flash.padded_segment_ids(key_mask)
  out = flash.splash_attention(q, k, v, seg, seg, causal=False, sliding_window=None,
                               interpret=True)
  ref, _ = xla_attention(q, k, v, make_attention_mask(key_mask), None)
  np.testing.assert_allclose(out[:, :150], ref[:, :150], atol=1e-5)


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN needs an NVIDIA GPU")
def test_cudnn_matches_xla_on_gpu():
  ids = random_ids(7, (B, 128))
  mask = jnp.concatenate([jnp.ones((B, 100), jnp.int32), jnp.zeros((B, 28), jnp.int32)], 1)
  cfg = tiny_config(num_heads=2, emb_dim=128, max_len=128, dtype="bfloat16", pooling="mean")
  outs = []
  for impl in ("xla", "cudnn"):
    model = Encoder(cfg.replace(attention_impl=impl))
    variables = jax.jit(model.init)(jax.random.key(0), ids)
    fn = jax.jit(lambda v, m=model: m.apply(v, ids, attention_mask=mask).last_hidden_state)
    if impl == "cudnn":
      assert "cudnn" in fn.lower(variables).compile().as_text().lower()
    outs.append(fn(variables).astype(jnp.float32) * mask[..., None])
  np.testing.assert_allclose(outs[1], outs[0], atol=5e-2)


def test_the_implementation_table_holds_every_attention_impl_once():
  from jaxencoder.model.config import ATTENTION_IMPLS
  assert sorted(flash.IMPLEMENTATIONS) == sorted(set(ATTENTION_IMPLS) - {"auto"})
  assert set(flash.AUTO_KERNEL.values()) <= set(flash.IMPLEMENTATIONS)


@pytest.mark.parametrize("facts, reason", [
    (dict(per_layer_window=True), "per-layer window traced under nn.scan"),
    (dict(cross=True), "cross-attention"),
    (dict(decode=True), "key/value cache"),
    (dict(output_attentions=True), "attention weights"),
])
def test_a_kernel_that_cannot_serve_a_call_runs_xla_decided_in_one_place(facts, reason, caplog):
  cfg = tiny_config(attention_impl="splash", dtype="bfloat16")
  with caplog.at_level("WARNING"):
    plan = flash.plan_attention(cfg, backend="tpu", **facts)
  assert (plan.impl, plan.wanted) == ("xla", "splash") and reason in plan.fallback
  flash._explained.clear()
  assert flash.plan_attention(cfg, backend="tpu") == flash.AttentionPlan("splash")


def test_linear_attention_is_never_swapped_for_softmax():
  cfg = tiny_config(attention_impl="linear")
  with pytest.raises(ValueError, match="'linear' cannot serve this call: attention weights"):
    flash.plan_attention(cfg, output_attentions=True)
