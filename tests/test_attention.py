"""Attention semantics: padding, bidirectionality, causal, windows, packing, positions."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import fast_first, jit_model, random_ids, tiny_config
from jaxencoder.model.attention import linear_attention, xla_attention
from jaxencoder.model.masks import make_attention_mask
from jaxencoder.model.positions import apply_rope, positions_from_segments, sinusoidal

POSITIONS = ["learned", "sinusoidal", "rope", "relative", "none"]


def encode(cfg, ids, **kwargs):
  variables, apply = jit_model(cfg, ids)
  return apply(variables, ids, **kwargs).last_hidden_state


def numpy_attention(q, k, v, mask):
  """Straightforward float64 reference: softmax(q k^T / sqrt(K) masked) v."""
  q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
  logits = np.einsum("bqhk,bshk->bhqs", q, k) / np.sqrt(q.shape[-1])
  logits = np.where(mask, logits, -1e30)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  return np.einsum("bhqs,bshk->bqhk", probs, v)


def test_xla_attention_matches_numpy_reference():
  q, k, v = (jax.random.normal(jax.random.key(i), (2, 6, 3, 8)) for i in range(3))
  mask = make_attention_mask(jnp.array([[1] * 6, [1] * 4 + [0] * 2]))
  out, probs = xla_attention(q, k, v, mask, None)
  np.testing.assert_allclose(out, numpy_attention(q, k, v, np.asarray(mask)), atol=1e-5)
  assert float(probs[1, :, :, 4:].max()) == 0.0


def test_linear_attention_matches_explicit_formula():
  q, k, v = (jax.random.normal(jax.random.key(i), (1, 5, 2, 4)) for i in range(3))
  key_mask = jnp.array([[1, 1, 1, 0, 0]])
  phi = lambda x: np.where(x > 0, x + 1, np.exp(x))
  fq, fk = phi(np.asarray(q, np.float64)), phi(np.asarray(k, np.float64))[:, :3]
  scores = np.einsum("bqhk,bshk->bhqs", fq, fk)
  expected = np.einsum("bhqs,bshk->bqhk", scores / scores.sum(-1, keepdims=True), v[:, :3])
  np.testing.assert_allclose(linear_attention(q, k, v, key_mask), expected, atol=1e-5)


@pytest.mark.parametrize("impl", fast_first(["xla", "fused", "linear"]))
@pytest.mark.parametrize("position", fast_first(POSITIONS, 3))
def test_padding_does_not_change_real_tokens(impl, position):
  if impl == "linear" and position == "relative":  # no relative bias: the config says so
    with pytest.raises(ValueError, match=r"attention_impl='linear' does not support .*relative"):
      tiny_config(attention_impl=impl, position_embedding=position)
    return
  cfg = tiny_config(attention_impl=impl, position_embedding=position, pooling="mean")
  ids = random_ids(1, (2, 7))
  padded = jnp.concatenate([ids, random_ids(2, (2, 5))], axis=1)  # garbage in the pads
  mask = jnp.concatenate([jnp.ones((2, 7), jnp.int32), jnp.zeros((2, 5), jnp.int32)], axis=1)
  variables, apply = jit_model(cfg, ids)
  short = apply(variables, ids)
  long = apply(variables, padded, attention_mask=mask)
  np.testing.assert_allclose(long.last_hidden_state[:, :7], short.last_hidden_state, atol=1e-5)
  np.testing.assert_allclose(long.pooled, short.pooled, atol=1e-5)


def _influence(cfg, source: int, target: int, length: int = 10) -> float:
  """Max change of output[target] when token[source] changes."""
  ids = random_ids(3, (1, length))
  changed = ids.at[0, source].set((ids[0, source] + 7) % cfg.vocab_size)
  variables, apply = jit_model(cfg, ids)
  before = apply(variables, ids).last_hidden_state[0, target]
  after = apply(variables, changed).last_hidden_state[0, target]
  return float(jnp.abs(after - before).max())


@pytest.mark.parametrize("impl", ["xla", "fused", "linear"])
def test_bidirectional_first_position_sees_the_last_token(impl):
  assert _influence(tiny_config(attention_impl=impl), source=9, target=0) > 1e-3


@pytest.mark.parametrize("impl", ["xla", "fused"])
def test_causal_first_position_ignores_the_future(impl):
  cfg = tiny_config(attention_impl=impl, causal=True)
  assert _influence(cfg, source=9, target=0) == 0.0
  assert _influence(cfg, source=0, target=9) > 1e-3


@pytest.mark.parametrize("impl", ["xla", "fused"])
def test_sliding_window_hides_tokens_outside_the_window(impl):
  cfg = tiny_config(attention_impl=impl, sliding_window=2, num_layers=1)
  assert _influence(cfg, source=8, target=5) == 0.0  # |8 - 5| > 2
  assert _influence(cfg, source=2, target=5) == 0.0
  assert _influence(cfg, source=7, target=5) > 1e-3  # inside the window


@pytest.mark.parametrize("impl", ["xla", "fused"])
@pytest.mark.parametrize("position", fast_first(["learned", "rope", "relative", "sinusoidal"], 2))
def test_packed_row_equals_each_sequence_alone(impl, position):
  cfg = tiny_config(attention_impl=impl, position_embedding=position)
  a, b = random_ids(4, (1, 5)), random_ids(5, (1, 4))
  packed = jnp.concatenate([a, b, jnp.zeros((1, 3), jnp.int32)], axis=1)
  segments = jnp.array([[1] * 5 + [2] * 4 + [0] * 3])
  variables, apply = jit_model(cfg, a)
  got = apply(variables, packed, segment_ids=segments).last_hidden_state
  np.testing.assert_allclose(got[:, :5], apply(variables, a).last_hidden_state, atol=1e-5)
  np.testing.assert_allclose(got[:, 5:9], apply(variables, b).last_hidden_state, atol=1e-5)


def test_positions_restart_per_segment():
  segments = jnp.array([[1, 1, 1, 2, 2, 3, 0, 0]])
  np.testing.assert_array_equal(positions_from_segments(segments), [[0, 1, 2, 0, 1, 0, 0, 1]])


@pytest.mark.parametrize("position, equivariant", fast_first([
    ("none", True), ("learned", False), ("sinusoidal", False), ("rope", False),
    ("relative", False)], 2))
def test_permutation_equivariance_only_without_positions(position, equivariant):
  cfg = tiny_config(position_embedding=position, type_vocab_size=0)
  ids = random_ids(6, (1, 8))
  perm = jnp.array([3, 0, 7, 1, 6, 2, 5, 4])
  out = encode(cfg, ids)
  out_perm = encode(cfg, ids[:, perm])
  close = np.allclose(out_perm, out[:, perm], atol=1e-5)
  assert close == equivariant


def test_sinusoidal_matches_closed_form():
  dim, positions = 16, jnp.array([0, 1, 5, 1000])
  table = np.asarray(sinusoidal(positions, dim))
  for row, p in enumerate([0, 1, 5, 1000]):
    for i in range(dim // 2):
      angle = p / 10000 ** (2 * i / dim)
      assert table[row, 2 * i] == pytest.approx(np.sin(angle), abs=1e-4)
      assert table[row, 2 * i + 1] == pytest.approx(np.cos(angle), abs=1e-4)


def test_sinusoidal_model_runs_beyond_max_len():
  cfg = tiny_config(position_embedding="sinusoidal", max_len=8)
  assert encode(cfg, random_ids(0, (1, 20))).shape == (1, 20, 32)


def test_rope_logits_depend_only_on_relative_offset():
  q = jax.random.normal(jax.random.key(7), (1, 1, 1, 16))
  k = jax.random.normal(jax.random.key(8), (1, 1, 1, 16))
  def logit(m, n):
    qm = apply_rope(q, jnp.array([[m]]), 10_000.0)
    kn = apply_rope(k, jnp.array([[n]]), 10_000.0)
    return float(jnp.sum(qm * kn))
  assert logit(3, 1) == pytest.approx(logit(12, 10), abs=1e-4)
  assert logit(0, 5) == pytest.approx(logit(100, 105), abs=1e-4)
  assert abs(logit(3, 1) - logit(3, 2)) > 1e-3
  np.testing.assert_allclose(jnp.linalg.norm(apply_rope(q, jnp.array([[9]]), 1e4)),
                             jnp.linalg.norm(q), rtol=1e-5)


@pytest.mark.parametrize("mask_kind", ["none", "padding", "segments", "causal", "window"])
@pytest.mark.parametrize("position", fast_first(["learned", "relative"]))
def test_fused_equals_xla(mask_kind, position):
  extra = {"causal": dict(causal=True), "window": dict(sliding_window=2)}.get(mask_kind, {})
  ids = random_ids(9, (2, 9))
  kwargs = {}
  if mask_kind == "padding":
    kwargs["attention_mask"] = jnp.array([[1] * 9, [1] * 5 + [0] * 4])
  if mask_kind == "segments":
    kwargs["segment_ids"] = jnp.array([[1] * 4 + [2] * 5, [1] * 6 + [0] * 3])
  outs = [encode(tiny_config(attention_impl=impl, position_embedding=position, **extra),
                 ids, **kwargs) for impl in ("xla", "fused")]
  np.testing.assert_allclose(outs[1], outs[0], atol=1e-5)
