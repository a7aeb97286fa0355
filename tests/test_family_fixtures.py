"""Every family's conventions against transformers, without torch: committed fixtures.

tests/fixtures/families/<family>/ is a tiny random-weight transformers model as
save_pretrained wrote it, with reference.npz: its inputs and float32 outputs (written
by tools/make_family_fixtures.py with torch + transformers). Each directory loads with
jaxencoder.pretrained.load and must reproduce last_hidden_state on real tokens (and
pooler_output where there is one). `apply_rope` is checked against rotate-half RoPE
computed here by hand.
"""

import functools
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from jaxencoder import Encoder
from jaxencoder.model.positions import apply_rope
from jaxencoder.pretrained import encoder_params, load

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "families"
FAMILIES = ("roberta", "distilbert", "electra", "modernbert", "vit")
TOL = 2e-5  # max-abs; float32 on CPU gives ~1e-6 (the live torch tests allow 1e-4)


@functools.cache
def family(name: str):
  """(cfg, encoder params, reference arrays) of one fixture directory."""
  cfg, params, _ = load(FIXTURES / name)
  return cfg, encoder_params(params), dict(np.load(FIXTURES / name / "reference.npz"))


def run(cfg, params, ref):
  """(last_hidden_state, pooled) of the Encoder on the fixture's inputs."""
  if "pixel_values" in ref:  # HF [B, C, H, W] -> our [B, H, W, C]
    out = Encoder(cfg).apply({"params": params}, jnp.asarray(ref["pixel_values"].transpose(
        0, 2, 3, 1)))
  else:
    types = ref.get("token_type_ids")
    out = Encoder(cfg).apply({"params": params}, jnp.asarray(ref["input_ids"]),
                             jnp.asarray(ref["attention_mask"]),
                             None if types is None else jnp.asarray(types))
  return np.asarray(out.last_hidden_state), np.asarray(out.pooled)


@pytest.mark.parametrize("name", FAMILIES)
def test_family_fixture_matches_transformers(name):
  cfg, params, ref = family(name)
  assert cfg.family == name
  last_BxLxD, pooled_BxD = run(cfg, params, ref)
  expected_BxLxD = ref["last_hidden_state"]
  assert last_BxLxD.shape == expected_BxLxD.shape
  # Real tokens only: padding rows never reach them, and RoBERTa numbers them differently.
  real_BxL = ref.get("attention_mask", np.ones(expected_BxLxD.shape[:2])) == 1
  error = float(np.abs(last_BxLxD - expected_BxLxD)[real_BxL].max())
  assert error < TOL, f"{name}: last_hidden_state max-abs {error:.2e}"
  if "pooler_output" in ref:
    assert cfg.pooler_dense
    pooled_error = float(np.abs(pooled_BxD - ref["pooler_output"]).max())
    assert pooled_error < TOL, f"{name}: pooler_output max-abs {pooled_error:.2e}"


def test_fixtures_exercise_the_conventions_they_stand_for():
  """Regenerated fixtures must keep what makes each check bite."""
  for name in FAMILIES[:4]:
    mask_BxL = family(name)[2]["attention_mask"]
    assert mask_BxL.all(axis=1).any() and (mask_BxL[:, -1] == 0).any()  # full + right-padded
  assert family("roberta")[0].position_offset == 2  # padding_idx + 1
  assert set(np.unique(family("electra")[2]["token_type_ids"])) == {0, 1}
  assert family("electra")[0].embedding_dim == 16  # projected up to emb_dim
  modern, _, modern_ref = family("modernbert")
  assert (modern.global_attention_every, modern.num_layers) == (3, 3)  # global, local, local
  assert modern.activation == "geglu" and modern.local_rope_base != modern.rope_base
  assert modern_ref["attention_mask"].sum(axis=1).max() > 2 * modern.sliding_window + 1
  vit_cfg, _, vit_ref = family("vit")
  assert vit_cfg.patch_grid == (4, 3) and vit_ref["last_hidden_state"].shape[1] == 1 + 12


# ------------------------------------------------------------------ RoPE by hand
def rotate_half_reference(x_BxLxHxK: np.ndarray, positions_BxL: np.ndarray,
                          base: float) -> np.ndarray:
  """HF (RoFormer / ModernBERT) RoPE in float64: pairs (i, i + K/2) rotate by
  pos * base^(-2i/K); out = x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]."""
  k = x_BxLxHxK.shape[-1]
  inv_freq_K2 = base ** (-2.0 * np.arange(k // 2) / k)
  theta_BxLx1xK2 = positions_BxL[:, :, None, None].astype(np.float64) * inv_freq_K2
  theta_BxLx1xK = np.concatenate([theta_BxLx1xK2, theta_BxLx1xK2], axis=-1)
  x1, x2 = x_BxLxHxK[..., :k // 2], x_BxLxHxK[..., k // 2:]
  rotated_half = np.concatenate([-x2, x1], axis=-1)
  return x_BxLxHxK * np.cos(theta_BxLx1xK) + rotated_half * np.sin(theta_BxLx1xK)


@pytest.mark.parametrize("base", [10_000.0, 50.0])
def test_apply_rope_matches_a_hand_computed_rotate_half_reference(base):
  b, l, h, k = 2, 5, 2, 8
  x_BxLxHxK = (np.arange(b * l * h * k).reshape(b, l, h, k) % 7 - 3.0) / 3.0
  x_BxLxHxK[0, 1, 0] = [1, -2, 0.5, 3, -1, 0.25, 2, -0.5]
  positions_BxL = np.array([[0, 1, 2, 7, 3], [5, 100, 5, 31, 0]])  # gaps, repeats, unordered
  ours = np.asarray(apply_rope(jnp.asarray(x_BxLxHxK, jnp.float32), jnp.asarray(positions_BxL),
                               base))
  np.testing.assert_allclose(ours, rotate_half_reference(x_BxLxHxK, positions_BxL, base),
                             atol=2e-5, rtol=0)
  # Closed forms: position 0 is the identity; a one-hot x at feature i (first half)
  # at position p becomes cos(p w_i) there and sin(p w_i) at i + K/2, w_i = base^(-2i/K).
  np.testing.assert_allclose(ours[1, 4], x_BxLxHxK[1, 4], atol=1e-7)
  p = 7.0
  for i in range(k // 2):
    one_hot = np.zeros((1, 1, 1, k))
    one_hot[..., i] = 1.0
    out_K = np.asarray(apply_rope(jnp.asarray(one_hot, jnp.float32), jnp.array([[p]]), base))[
        0, 0, 0]
    expected_K = np.zeros(k)
    expected_K[i], expected_K[i + k // 2] = np.cos(p * base ** (-2 * i / k)), np.sin(
        p * base ** (-2 * i / k))
    np.testing.assert_allclose(out_K, expected_K, atol=1e-6, err_msg=f"pair {i}")
