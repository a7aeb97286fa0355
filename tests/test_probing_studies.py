"""MDL probes and the head study inside a probing study (study.run with mdl / heads), on
a tiny encoder: report keys, and the head study's loss checked against the features."""

import numpy as np
import optax
import pytest

from jaxencoder.probing import features, head_study, probes, study
from test_probing_cli import model, tagged_dataset  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def dataset():
  lengths = np.random.default_rng(0).integers(3, 12, size=40)
  return tagged_dataset(lengths)


@pytest.fixture(scope="module")
def report(model, dataset, tmp_path_factory):
  cfg, params, tok = model
  options = study.StudyOptions(batch_size=8, max_length=32, mdl=True, heads=True,
                               heads_sentences=8, progress=False,
                               probe=probes.ProbeConfig(max_epochs=5))
  return study.run(cfg, params, tok, dataset, tmp_path_factory.mktemp("study"), options)


def test_mdl_reports_code_lengths_per_layer_with_the_control_tasks(report, model):
  cfg = model[0]
  layers = report["probes"]["mdl"]["layers"]
  assert len(layers) == cfg.num_layers + 1
  train_items = report["probes"]["linear"]["split_sizes"]["train"]
  classes = len(report["labels"])
  for row in layers:
    assert row["uniform_bits"] == pytest.approx(train_items * np.log2(classes))
    assert row["compression"] == pytest.approx(row["uniform_bits"] / row["online_bits"])
    assert row["control_compression"] == pytest.approx(
        row["control_uniform_bits"] / row["control_online_bits"])
  # Tags that are a function of the word: the embeddings already hold them.
  assert layers[0]["compression"] > 1.2


def test_the_head_study_reports_every_head_and_a_pruning_curve(report, model):
  cfg = model[0]
  heads = report["heads"]
  assert np.shape(heads["importance"]) == (cfg.num_layers, cfg.num_heads)
  assert np.shape(heads["gradient_importance"]) == (cfg.num_layers, cfg.num_heads)
  assert np.any(np.array(heads["importance"]) != 0)
  assert heads["pruning"][0] == {"pruned": 0, "loss": pytest.approx(heads["base_loss"])}
  assert heads["pruning"][-1]["pruned"] == cfg.num_layers * cfg.num_heads - 1
  assert {"probe_mdl.png", "head_importance.png", "head_pruning.png"} <= {
      p.rsplit("/", 1)[-1] for p in report["plots"]}


def test_the_head_studys_loss_with_every_head_is_the_probes_loss_on_the_features(
    model, dataset):
  """Its last-layer features, recomputed in its own batches under an all-ones mask, are
  the study's features: the same probe gives the same loss on them."""
  cfg, params, tok = model
  feats = features.extract(cfg, params, tok, dataset, batch_size=8, max_length=32,
                           progress=False)
  probe_cfg = probes.ProbeConfig(max_epochs=5)
  splits = probes.split_items(feats.sentence_ids_M, seed=0)
  last = np.asarray(feats.layers[-1])
  mean, std = last[splits["train"]].mean(0), np.maximum(last[splits["train"]].std(0), 1e-6)
  x = (last - mean) / std
  probe_params, _ = probes.train_probe(x[splits["train"]], feats.labels_M[splits["train"]],
                                       x[splits["dev"]], feats.labels_M[splits["dev"]],
                                       len(feats.label_names), probe_cfg)
  chosen = np.unique(feats.sentence_ids_M[splits["test"]])[:5]
  items = np.flatnonzero(np.isin(feats.sentence_ids_M, chosen))
  want = optax.softmax_cross_entropy_with_integer_labels(
      probes.logits(probe_params, x[items]), feats.labels_M[items]).mean()
  batches = head_study._batches(tok, dataset, feats, chosen, 8, 32)
  scorer = head_study._Scorer(cfg, params, probe_params, mean, std, batches)
  loss, accuracy = scorer.loss_and_accuracy(np.ones((cfg.num_layers, cfg.num_heads)))
  assert loss == pytest.approx(float(want), rel=1e-5)
  assert accuracy == pytest.approx(probes.accuracy(probe_params, x[items],
                                                   feats.labels_M[items]))


def test_the_most_important_heads_count_layers_from_one_as_block_numbers(report, model):
  cfg = model[0]
  importance_NxH = np.array(report["heads"]["importance"])
  top = report["heads"]["most_important"][0]
  # layer 0 = embeddings, so row r of the [N, H] matrix is layer r + 1; heads from 0
  assert importance_NxH[top["layer"] - 1, top["head"]] == importance_NxH.max()
  assert all(1 <= row["layer"] <= cfg.num_layers for row in report["heads"]["most_important"])
