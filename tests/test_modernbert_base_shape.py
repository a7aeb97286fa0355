"""ModernBERT-base's layer pattern against transformers, without torch: a committed fixture.

tests/fixtures/families/modernbert_base_shape/ is a random ModernBertForMaskedLM with
ModernBERT-base's pattern at a tiny width (22 layers, global every 3rd, a window the rows
exceed, 160k / 10k RoPE bases, no biases; tools/make_family_fixtures.py wrote it and its
reference.npz). Looped and scanned (7 periods of 3 under nn.scan, then layer 21) it must
reproduce transformers' last_hidden_state and MLM logits on real tokens, and the scanned
params saved back must be the fixture's own tensors.
"""

import functools
import pathlib

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from jaxencoder import EncoderForMaskedLM
from jaxencoder.model.encoder import period_layout
from jaxencoder.pretrained import modernbert

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "families" / "modernbert_base_shape"
TOL = 2e-5  # max-abs, as tests/test_family_fixtures.py
REF = dict(np.load(FIXTURE / "reference.npz"))
REAL_BxL = REF["attention_mask"] == 1


@functools.cache
def loaded(scan_layers: bool):
  """(cfg, params) of the fixture in the looped or scanned layout."""
  cfg, params, _ = modernbert.load(FIXTURE, scan_layers=scan_layers)
  return cfg, params


@functools.cache
def masked_lm_fn(cfg):
  """Jitted (logits [B, L, V], last_hidden_state [B, L, D]) of EncoderForMaskedLM(cfg)."""
  def apply(params, ids_BxL, mask_BxL):
    logits_BxLxV, out = EncoderForMaskedLM(cfg).apply({"params": params}, ids_BxL, mask_BxL)
    return logits_BxLxV, out.last_hidden_state
  return jax.jit(apply)


def outputs(cfg, params):
  ids_BxL, mask_BxL = jnp.asarray(REF["input_ids"]), jnp.asarray(REF["attention_mask"])
  return tuple(np.asarray(x) for x in masked_lm_fn(cfg)(params, ids_BxL, mask_BxL))


def max_real_diff(ours, theirs) -> float:
  return float(np.abs(ours - theirs)[REAL_BxL].max())


def test_fixture_has_modernbert_base_pattern():
  """What makes the parity checks bite: base's pattern, a window the rows exceed, a head."""
  cfg, params = loaded(scan_layers=True)
  assert (cfg.num_layers, cfg.global_attention_every) == (22, 3)
  assert period_layout(cfg, sparse_last=False) == (3, 7, (21,))  # 7 periods, layer 21 alone
  assert (cfg.rope_base, cfg.local_rope_base) == (160_000.0, 10_000.0)
  assert not cfg.use_bias and not cfg.norm_bias and cfg.activation == "geglu"
  assert REF["attention_mask"].sum(axis=1).max() > 2 * cfg.sliding_window + 1
  assert (REF["attention_mask"][:, -1] == 0).any()  # right-padded rows
  assert set(params) == {"encoder", "mlm_head"}
  assert jax.tree.leaves(params["encoder"]["layers"])[0].shape[0] == 22


@pytest.mark.parametrize("scan_layers", [True, False])
def test_fixture_matches_transformers_hidden_states_and_logits(scan_layers):
  cfg, params = loaded(scan_layers)
  assert cfg.scan_layers == scan_layers
  logits_BxLxV, last_BxLxD = outputs(cfg, params)
  hidden_error = max_real_diff(last_BxLxD, REF["last_hidden_state"])
  logits_error = max_real_diff(logits_BxLxV, REF["logits"])
  print(f"modernbert_base_shape scan_layers={scan_layers}: last_hidden_state max-abs "
        f"{hidden_error:.2e}, logits max-abs {logits_error:.2e}")
  assert hidden_error < TOL and logits_error < TOL


def test_logits_at_masked_positions_match_transformers_through_the_sparse_last_layer():
  """Training's path: 7 periods scanned, then layer 21 (global) on the masked rows only."""
  cfg, params = loaded(scan_layers=True)
  rows_BxM = jnp.array([[0, 9, 19], [2, 6, 12], [1, 3, 5]])  # real tokens of each row
  logits_BxMxV, _ = jax.jit(EncoderForMaskedLM(cfg).apply)(
      {"params": params}, jnp.asarray(REF["input_ids"]), jnp.asarray(REF["attention_mask"]),
      masked_positions=rows_BxM)
  expected_BxMxV = np.take_along_axis(REF["logits"], np.asarray(rows_BxM)[..., None], axis=1)
  error = float(np.abs(np.asarray(logits_BxMxV) - expected_BxMxV).max())
  print(f"modernbert_base_shape masked-position logits max-abs {error:.2e}")
  assert error < TOL


def test_scanned_params_save_as_the_fixture_tensors_and_reload_to_the_same_numbers(tmp_path):
  cfg, params = loaded(scan_layers=True)
  directory = modernbert.save(tmp_path, cfg, params)
  chex.assert_trees_all_equal(load_file(str(directory / "model.safetensors")),
                              load_file(str(FIXTURE / "model.safetensors")))
  cfg_1, params_1, _ = modernbert.load(directory, scan_layers=True)
  chex.assert_trees_all_equal(outputs(cfg_1, params_1), outputs(cfg, params))
