"""Activation patching (jaxencoder-probe --patch) on a tiny random masked LM, and the
generated agreement pairs."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import tiny_config
from data_helpers import VOCAB, tiny_tokenizer
from jaxencoder.data import agreement, fetch
from jaxencoder.model.heads import EncoderForMaskedLM
from jaxencoder.probing import patching

PAIRS = [
    {"clean": "the cat sat on a [MASK] .", "corrupted": "the dog sat on a [MASK] .",
     "target_clean": "mat", "target_corrupted": "fox"},
    {"clean": "the fox sat on a [MASK] .", "corrupted": "the cat sat on a [MASK] .",
     "target_clean": "dog", "target_corrupted": "mat"},
    {"clean": "a fox ran far [MASK] .", "corrupted": "a cat ran far [MASK] .",
     "target_clean": "away", "target_corrupted": "over"},
]


def tiny_mlm(**overrides):
  cfg = tiny_config(vocab_size=len(VOCAB), **overrides)
  variables = EncoderForMaskedLM(cfg).init(jax.random.key(0), np.ones((1, 8), np.int32))
  return cfg, nn.meta.unbox(variables["params"]), tiny_tokenizer()


@pytest.fixture(scope="module")
def mlm():
  return tiny_mlm()


def write_pairs(path, pairs=PAIRS):
  path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
  return path


def first_group(tok, path):
  return patching.group_pairs(tok, patching.read_pairs(write_pairs(path, PAIRS[:2])))[0]


def test_patching_every_position_of_the_last_layer_recovers_all_and_none_recovers_nothing(
    mlm, tmp_path):
  cfg, params, tok = mlm
  group = first_group(tok, tmp_path / "p.jsonl")
  ld_clean, ld_corrupt, layers, _ = patching.clean_and_corrupt(cfg, params, group)
  pairs, length = group.clean_PxL.shape
  where = np.zeros((cfg.num_layers, pairs, length))
  nothing = patching.patched_logit_diff(cfg, params, group, where, layers)
  where[-1] = 1
  everything = patching.patched_logit_diff(cfg, params, group, where, layers)
  np.testing.assert_allclose(everything, ld_clean, atol=1e-5)
  np.testing.assert_allclose(nothing, ld_corrupt, atol=1e-5)
  assert abs(patching.recovered(everything.mean(), ld_clean.mean(), ld_corrupt.mean()) - 1) < 1e-3
  assert abs(patching.recovered(nothing.mean(), ld_clean.mean(), ld_corrupt.mean())) < 1e-3


def test_the_sweep_equals_one_run_per_layer_and_position(mlm, tmp_path):
  """The batched sweep (all positions of a layer in one run) equals patching one
  (layer, position) at a time; at the last layer only the mask position matters."""
  cfg, params, tok = mlm
  group = first_group(tok, tmp_path / "p.jsonl")
  _, ld_corrupt, layers, _ = patching.clean_and_corrupt(cfg, params, group)
  pairs, length = group.clean_PxL.shape
  swept_NxL = patching.sweep(cfg, params, group, layers, "position", chunk_rows=length)
  for n in range(cfg.num_layers):
    for pos in range(length):
      where = np.zeros((cfg.num_layers, pairs, length))
      where[n, :, pos] = 1
      one = patching.patched_logit_diff(cfg, params, group, where, layers)
      np.testing.assert_allclose(swept_NxL[n, pos], one.sum(), atol=1e-4)
  mask = group.mask_index_P[0]
  others = np.delete(swept_NxL[-1], mask)
  np.testing.assert_allclose(others, ld_corrupt.sum(), atol=1e-4)


def test_the_report_has_a_layer_by_position_and_a_layer_by_head_grid(mlm, tmp_path):
  cfg, params, tok = mlm
  result = patching.run(cfg, params, tok, write_pairs(tmp_path / "p.jsonl"), progress=False)
  grid = np.array(result["layer_position"], float)
  assert grid.shape == (cfg.num_layers, len(result["positions"]))
  assert result["positions"][0] == "[CLS]" and "[MASK]" in result["positions"]
  assert np.array(result["layer_head"], float).shape == (cfg.num_layers, cfg.num_heads)
  assert [g["pairs"] for g in result["groups"]] == [2, 1]  # two lengths, largest first
  mask = result["positions"].index("[MASK]")
  assert grid[-1, mask] == pytest.approx(1.0, abs=1e-3)
  assert patching.plot(result, tmp_path / "patching.png").read_bytes()[:4] == b"\x89PNG"
  assert "recovered fraction" in patching.summary(result)


@pytest.mark.parametrize("scan", [False, True])
def test_a_pre_norm_models_last_row_is_patched_after_its_final_norm(scan, tmp_path):
  """Its last layer is hidden_states[N] (after the final norm), patched there: every
  position recovers all, [MASK] alone recovers all, any other position nothing."""
  cfg, params, tok = tiny_mlm(norm_position="pre", scan_layers=scan)
  group = first_group(tok, tmp_path / "p.jsonl")
  ld_clean, ld_corrupt, layers, _ = patching.clean_and_corrupt(cfg, params, group)
  pairs, length = group.clean_PxL.shape
  where = np.zeros((cfg.num_layers, pairs, length))
  where[-1] = 1
  everything = patching.patched_logit_diff(cfg, params, group, where, layers)
  np.testing.assert_allclose(everything, ld_clean, atol=1e-5)
  swept_L = patching.sweep(cfg, params, group, layers, "position")[-1]
  mask = group.mask_index_P[0]
  np.testing.assert_allclose(swept_L[mask], ld_clean.sum(), atol=1e-4)
  np.testing.assert_allclose(np.delete(swept_L, mask), ld_corrupt.sum(), atol=1e-4)
  result = patching.run(cfg, params, tok, write_pairs(tmp_path / "p.jsonl"), progress=False)
  last_row = np.array(result["layer_position"], float)[-1]
  assert np.isfinite(last_row).all()
  assert last_row[result["positions"].index("[MASK]")] == pytest.approx(1.0, abs=1e-3)


def test_pairs_of_unequal_token_length_are_refused_naming_the_line(mlm, tmp_path):
  _, _, tok = mlm
  bad = PAIRS[:1] + [{**PAIRS[0], "corrupted": "the dog sat on a big [MASK] ."}]
  with pytest.raises(ValueError, match=r"line 2: clean and corrupted tokenise to 9 and 10 "):
    patching.group_pairs(tok, patching.read_pairs(write_pairs(tmp_path / "p.jsonl", bad)))


def test_a_pair_without_its_fields_or_with_a_multi_piece_target_is_refused(mlm, tmp_path):
  _, _, tok = mlm
  (tmp_path / "a.jsonl").write_text(json.dumps({"clean": "x"}) + "\n")
  with pytest.raises(ValueError, match=r"--patch .*a.jsonl:1: needs string fields .* missing "
                                       r"corrupted, target_clean, target_corrupted"):
    patching.read_pairs(tmp_path / "a.jsonl")
  two = [{**PAIRS[0], "target_clean": "cats"}]  # cat + ##s
  with pytest.raises(ValueError, match="line 1: target .cats. is 2 word pieces"):
    patching.group_pairs(tok, patching.read_pairs(write_pairs(tmp_path / "b.jsonl", two)))


def test_patching_needs_an_mlm_head(mlm, tmp_path):
  cfg, params, tok = mlm
  with pytest.raises(ValueError, match="--patch needs a model with an MLM head"):
    patching.run(cfg, params["encoder"], tok, write_pairs(tmp_path / "p.jsonl"))


# ------------------------------------------------------------------ agreement pairs
def test_agreement_pairs_are_deterministic_minimal_pairs_whose_targets_agree():
  pairs = agreement.pairs(40, seed=3)
  assert pairs == agreement.pairs(40, seed=3) and pairs != agreement.pairs(40, seed=4)
  singular = {s for s, _ in agreement.NOUNS}
  for p in pairs:
    clean, corrupted = p["clean"].split(), p["corrupted"].split()
    assert len(clean) == len(corrupted) and clean.count("[MASK]") == 1
    assert sum(a != b for a, b in zip(clean, corrupted)) == 1  # the subject only
    subject_is_singular = clean[1] in singular
    verb = next(v for v, _ in agreement.VERBS if p["target_clean"] in v)
    assert p["target_clean"] == verb[0 if subject_is_singular else 1]
    assert p["target_corrupted"] == verb[1 if subject_is_singular else 0]
  assert {p["template"] for p in pairs} == {"pp", "rc"}
  assert {p["attractor"] for p in pairs} == {"singular", "plural"}


def test_agreement_pairs_tokenise_to_equal_lengths_with_the_minilm_vocab(minilm):
  from jaxencoder.tokenizer import Tokenizer
  tok = Tokenizer.from_file(minilm)
  groups = patching.group_pairs(tok, [{**p, "line": i + 1}
                                      for i, p in enumerate(agreement.pairs())])
  assert sorted(g.name for g in groups) == ["pp, 10 tokens", "rc, 11 tokens"]


def test_the_agreement_source_is_fetched_offline(tmp_path):
  out = fetch.fetch("agreement_pairs", tmp_path)
  lines = (out / agreement.FILE).read_text().splitlines()
  assert [json.loads(line) for line in lines] == agreement.pairs()
