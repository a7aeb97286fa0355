"""A scanned stack of global and local layers runs by period: nn.scan over groups of
`global_attention_every` layers, each slot with its static window, RoPE base and attention
plan, then the layers left over. It must compute what the looped stack computes, from the
same stored [N] params, and keep a flash kernel in every layer it can serve."""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import fast_first, random_ids, tiny_config
from jaxencoder import Encoder, loop_to_scan, scan_to_loop
from jaxencoder.model import flash
from jaxencoder.model.encoder import period_layout

B, L = 2, 16
PADDED_BxL = jnp.array([[1] * L, [1] * 11 + [0] * (L - 11)], jnp.int32)
PACKED_BxL = jnp.array([[1] * 6 + [2] * 7 + [3] * 3, [1] * 4 + [2] * 9 + [0] * 3], jnp.int32)


def modern(num_layers: int, **overrides):
  """ModernBERT's pattern at a tiny size: layer i % 3 == 0 global (RoPE 160k), the others
  local (window 3, RoPE 10k), pre-norm, layer 0's attention input unnormalised, GeGLU."""
  fields = dict(num_layers=num_layers, position_embedding="rope", rope_base=160_000.0,
                local_rope_base=10_000.0, global_attention_every=3, sliding_window=3,
                activation="geglu", norm_position="pre", first_attention_norm=False,
                use_bias=False, norm_bias=False, pooling="mean")
  return tiny_config(**{**fields, **overrides})


def inputs(kind: str) -> dict:
  if kind == "padded":
    return {"attention_mask": PADDED_BxL}
  return {"segment_ids": PACKED_BxL}


def real_rows(kind: str):
  return (PADDED_BxL if kind == "padded" else (PACKED_BxL > 0).astype(jnp.int32))[..., None]


def outputs_and_grads(cfg, params, ids, kind):
  """Real rows of the last hidden state and d(loss)/d(params) (loss = sum of sin(output))."""
  model = Encoder(cfg)

  def loss(p):
    out = model.apply({"params": p}, ids, **inputs(kind)).last_hidden_state * real_rows(kind)
    return jnp.sum(jnp.sin(out)), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
  return out, grads


def loop_params(cfg, ids):
  return nn.meta.unbox(Encoder(cfg).init(jax.random.key(0), ids))["params"]


def assert_close(a, b, tol):
  """Within `tol` of the larger side's scale (float32 sums in another order)."""
  scale = max(1.0, float(np.abs(np.asarray(b)).max()))
  np.testing.assert_allclose(a, b, rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("num_layers,kind", fast_first(
    [(6, "packed"), (3, "padded"), (6, "padded"), (3, "packed"), (22, "padded"),
     (22, "packed")]))
def test_scan_by_period_equals_the_loop_in_outputs_and_gradients(num_layers, kind):
  ids = random_ids(0, (B, L))
  cfg = modern(num_layers)
  params = loop_params(cfg, ids)
  out_loop, grads_loop = outputs_and_grads(cfg, params, ids, kind)
  out_scan, grads_scan = outputs_and_grads(cfg.replace(scan_layers=True), loop_to_scan(params),
                                           ids, kind)
  assert_close(out_scan, out_loop, 1e-6)
  jax.tree.map(lambda a, b: assert_close(a, b, 1e-6), scan_to_loop(grads_scan), grads_loop)


def test_period_layout_scans_whole_periods_and_unrolls_the_rest():
  assert period_layout(modern(22), sparse_last=False) == (3, 7, (21,))
  assert period_layout(modern(22), sparse_last=True) == (3, 7, (21,))
  assert period_layout(modern(6), sparse_last=False) == (3, 2, ())
  assert period_layout(modern(6), sparse_last=True) == (3, 1, (3, 4, 5))
  assert period_layout(modern(2), sparse_last=False) == (3, 0, (0, 1))
  assert period_layout(tiny_config(num_layers=4), sparse_last=True) == (1, 3, (3,))


def test_intermediates_come_back_in_layer_order():
  ids = random_ids(1, (B, L))
  cfg = modern(5)
  params = loop_params(cfg, ids)
  kw = dict(attention_mask=PADDED_BxL, output_hidden_states=True, output_attentions=True)
  loop = jax.jit(lambda p: Encoder(cfg).apply({"params": p}, ids, **kw))(params)
  scan = jax.jit(lambda p: Encoder(cfg.replace(scan_layers=True)).apply({"params": p}, ids, **kw))(
      loop_to_scan(params))
  assert len(scan.hidden_states) == 6 and len(scan.attentions) == 5
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), scan, loop)
  # local layers see only their window: probabilities beyond |i - j| > 3 are zero (row 0
  # has no padding, whose fully masked query rows spread evenly)
  far = np.abs(np.arange(L)[:, None] - np.arange(L)[None, :]) > 3
  assert float(np.abs(np.asarray(scan.attentions[1])[0][..., far]).max()) == 0.0
  assert float(np.abs(np.asarray(scan.attentions[3])[0][..., far]).max()) > 0.0  # global


def test_sparse_last_block_by_period_equals_the_loop():
  """MLM's gathered last block after a scan by period (6 layers: 1 group, then 3-5)."""
  ids = random_ids(2, (B, L))
  rows = jnp.array([[2, 5, 11], [0, 3, 9]], jnp.int32)
  cfg = modern(6, pooling="cls")
  params = loop_params(cfg, ids)
  run = lambda c, p: jax.jit(lambda p: Encoder(c).apply(
      {"params": p}, ids, attention_mask=PADDED_BxL, output_positions=rows))(p)
  loop, scan = run(cfg, params), run(cfg.replace(scan_layers=True), loop_to_scan(params))
  np.testing.assert_allclose(scan.last_hidden_state, loop.last_hidden_state, atol=1e-5)
  np.testing.assert_allclose(scan.pooled, loop.pooled, atol=1e-5)


# ---------------------------------------------------------------- the kernel in every layer
@pytest.mark.parametrize("kind", fast_first(["packed", "padded"]))
def test_splash_in_the_scanned_mixed_stack_matches_xla(kind):
  """Splash (Pallas interpret mode on CPU) in every layer of the scan by period: outputs and
  gradients as the xla reference, padded and packed rows."""
  ids = random_ids(3, (B, L))
  cfg = modern(4, scan_layers=True)
  params = loop_to_scan(loop_params(cfg.replace(scan_layers=False), ids))
  with flash.recorded_plans() as plans:
    out, grads = outputs_and_grads(cfg.replace(attention_impl="splash"), params, ids, kind)
  assert [p.impl for p in plans[-1]] == ["splash"] * 4
  ref, ref_grads = outputs_and_grads(cfg.replace(attention_impl="xla"), params, ids, kind)
  np.testing.assert_allclose(out, ref, atol=2e-5)
  jax.tree.map(lambda g, r: np.testing.assert_allclose(g, r, atol=2e-5, rtol=1e-5), grads,
               ref_grads)


def test_the_scanned_mixed_stack_builds_no_dense_mask_with_splash():
  ids = random_ids(4, (B, L))
  cfg = modern(3, scan_layers=True)
  params = loop_to_scan(loop_params(cfg.replace(scan_layers=False), ids))
  for impl, expected in (("xla", True), ("splash", False)):
    apply = lambda p, c=cfg.replace(attention_impl=impl): Encoder(c).apply(
        {"params": p}, ids, attention_mask=PADDED_BxL)
    assert (f"bool[{B},1,{L},{L}]" in str(jax.make_jaxpr(apply)(params))) == expected, impl


def test_a_sparse_last_local_layer_falls_back_alone_and_the_log_names_it(caplog):
  """6 layers, layer 5 local: gathered query rows cannot take splash's static window, so
  layer 5 alone runs xla; the global layers and the other local ones keep splash."""
  flash._explained.clear()
  cfg = modern(6, attention_impl="splash", pooling="cls")
  with caplog.at_level(logging.WARNING, logger="jaxencoder.model.flash"):
    plans = flash.plan_layers(cfg, sparse_last=True, backend="tpu")
  assert [p.impl for p in plans] == ["splash"] * 5 + ["xla"]
  assert [r.getMessage() for r in caplog.records] == [
      "attention_impl='splash': splash cannot run layers 5 of 6 (a causal or windowed mask on "
      "a sparse set of query rows (the sparse MLM last block: max_predictions=0 computes every "
      "row)); using xla"]
  # ModernBERT-base's last layer (21) is global: its gathered rows keep the kernel.
  assert {p.impl for p in flash.plan_layers(modern(22, attention_impl="splash"),
                                            sparse_last=True, backend="tpu")} == {"splash"}


def test_a_fallback_names_the_config_key_to_change():
  cfg = modern(3, attention_impl="splash", attention_dropout_rate=0.1)
  plans = flash.plan_layers(cfg, dropout_active=True, backend="tpu")
  assert flash.fallbacks(plans) == {
      ("splash", "attention dropout is on (the kernel has none: set "
                 "model.attention_dropout_rate=0)"): [0, 1, 2]}
  assert flash.layer_ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8"


def test_cudnn_serves_the_global_layers_and_the_local_ones_fall_back_alone(monkeypatch):
  """cuDNN's windows are causal only: ModernBERT's two-sided local windows run xla, its
  global layers (0, 3, ..., 21) keep cuDNN."""
  monkeypatch.setattr(flash, "max_cudnn_head_dim", lambda: 256)
  plans = flash.plan_layers(modern(22, attention_impl="cudnn", dtype="bfloat16"),
                            backend="gpu")
  assert [i for i, p in enumerate(plans) if p.impl == "cudnn"] == list(range(0, 22, 3))
  assert list(flash.fallbacks(plans)) == [
      ("cudnn", "a two-sided sliding window (cuDNN windows are causal only: "
                "model.sliding_window)")]
