"""Amnesic probing (jaxencoder-probe --amnesic): erase a property inside the forward pass
and rerun the model; its own objective moves only when its output reads the property."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import tiny_config
from data_helpers import VOCAB, WORDS
from jaxencoder.model.heads import EncoderClassifier, EncoderForMaskedLM
from jaxencoder.probing import amnesic, erasure, features, objectives, probes
from jaxencoder.tokenizer import Tokenizer

TAGS = {w: ("DET" if w in ("the", "a", "an") else "NOUN" if i % 2 else "VERB")
        for i, w in enumerate(WORDS)}
OTHER = {w: "short" if len(w) <= 3 else "long" for w in WORDS}  # independent of TAGS
PROBE = probes.ProbeConfig(max_epochs=20)


def tagged(count: int, seed: int = 0) -> features.Dataset:
  rng = np.random.default_rng(seed)
  words = [list(rng.choice(WORDS, size=5 + i % 7)) for i in range(count)]
  return features.Dataset("word", words, [[TAGS[w] for w in s] for s in words])


@pytest.fixture(scope="module")
def study():
  """A tiny random encoder, 120 tagged sentences and their features (the property: TAGS)."""
  cfg = tiny_config(vocab_size=len(VOCAB))
  tok = Tokenizer.from_vocab(VOCAB)
  model = EncoderClassifier(cfg, 2, token_level=True)
  params = nn.meta.unbox(model.init(jax.random.key(1), np.ones((1, 8), np.int32))["params"])
  dataset = tagged(120)
  feats = features.extract(cfg, params["encoder"], tok, dataset, progress=False)
  return cfg, params, tok, dataset, feats


def fitted_head(x_MxD, labels_M, num_classes):
  """A softmax-regression head's params {"classifier": kernel, bias} fitted on x."""
  w, _ = probes.train_probe(x_MxD, labels_M, x_MxD, labels_M, num_classes,
                            probes.ProbeConfig(max_epochs=60, standardize=False, l2=0.0,
                                               learning_rate=0.05, patience=60))
  return {"classifier": {"kernel": np.asarray(w["w_DxC"], np.float32),
                         "bias": np.asarray(w["b_C"], np.float32)}}


def objective(cfg, params, tok, dataset, feats, labels_M, num_classes, head_M):
  """A token classifier whose head is `head_M`, scored on `labels_M` over test sentences."""
  _, sentences = amnesic.held_out(feats, PROBE, 64)
  starts = np.concatenate([[0], np.cumsum(np.bincount(feats.sentence_ids_M))])
  whole = {"encoder": params["encoder"], "head": head_M}
  return objectives.ClassifierObjective(cfg, whole, objectives.item_batches(
      tok, dataset, sentences, lambda s: labels_M[starts[s]:starts[s + 1]], batch_size=16))


def test_erasing_a_property_the_output_reads_raises_the_loss_and_one_it_ignores_does_not(study):
  cfg, params, tok, dataset, feats = study
  last_MxD = np.asarray(feats.layers[-1], np.float32)
  splits, _ = amnesic.held_out(feats, PROBE, 0)
  train = splits["train"]
  # reads the property: a head fitted to TAGS on the last layer
  reads = fitted_head(last_MxD[train], feats.labels_M[train], len(feats.label_names))
  # ignores it: a head fitted to another word property on the TAGS-erased last layer,
  # composed with that eraser (it sees only what survives the erasure)
  other_M = np.array([0 if OTHER[w] == "short" else 1 for w in feats.types], np.int32)
  leace = erasure.fit_leace(last_MxD[train], feats.labels_M[train])
  head = fitted_head(leace.apply(last_MxD)[train], other_M[train], 2)
  kernel = head["classifier"]["kernel"]
  ignores = {"classifier": {"kernel": (leace.matrix_DxD @ kernel).astype(np.float32),
                            "bias": (leace.bias_D @ kernel + head["classifier"]["bias"]
                                     ).astype(np.float32)}}
  read = amnesic.run(cfg, feats, objective(cfg, params, tok, dataset, feats, feats.labels_M,
                                           len(feats.label_names), reads), PROBE, progress=False)
  ignored = amnesic.run(cfg, feats, objective(cfg, params, tok, dataset, feats, other_M, 2,
                                              ignores), PROBE, progress=False)
  last, last_ignored = read["layers"][-1], ignored["layers"][-1]
  assert last["objective_after"] > last["objective_before"] + 0.3
  assert abs(last_ignored["objective_after"] - last_ignored["objective_before"]) < 1e-3
  assert last["objective_after"] - last["objective_before"] > 3 * abs(
      last["objective_after_random"] - last["objective_before"])
  for row in read["layers"]:  # the probe is at the majority baseline after erasure
    assert row["probe_after"] <= read["majority"] + 0.1
  assert [r["layer"] for r in read["layers"]] == list(range(1, cfg.num_layers + 1))
  assert "loss" in amnesic.summary(read)


def test_the_mlm_objective_masks_the_same_tokens_in_every_call(study):
  cfg, _, tok, dataset, feats = study
  params = nn.meta.unbox(EncoderForMaskedLM(cfg).init(jax.random.key(2),
                                                      np.ones((1, 8), np.int32))["params"])
  _, sentences = amnesic.held_out(feats, PROBE, 32)
  first = objectives.MlmObjective(cfg, params, tok, dataset, sentences, batch_size=8)
  again = objectives.MlmObjective(cfg, params, tok, dataset, sentences, batch_size=16)
  assert first(None) == pytest.approx(again(None), rel=1e-5)  # masks do not depend on batching
  masked = sum(b["weights"].sum() for b in first.batches)
  real = sum(len(dataset.sentences[s]) for s in sentences)
  assert sentences.size <= masked < 0.4 * real
  identity = amnesic._erase(cfg, 1, erasure.AffineEraser(np.eye(cfg.emb_dim),
                                                         np.zeros(cfg.emb_dim), 0))
  assert first(identity) == pytest.approx(first(None), rel=1e-5)


def test_a_model_without_a_head_is_refused_in_one_line(study):
  from jaxencoder.probing import causal
  _, params, *_ = study
  with pytest.raises(ValueError, match=r"--amnesic needs a model with an MLM head .* or a "
                                       r"classifier run .*; --pretrained minilm has neither"):
    causal.check_model(params["encoder"], amnesic_study=True, patch=None,
                       source="--pretrained minilm")


def write_mlm_run(workdir, cfg, params, vocab_path):
  """A train.py-style masked-LM workdir: its encoder and MLM head at step 3."""
  from jaxencoder.io.checkpoint import Checkpointer
  with Checkpointer(workdir / "checkpoints", save_interval_steps=1, max_to_keep=1) as ckpt:
    ckpt.save(3, {"params": params}, force=True,
              config={"model": cfg.to_dict(), "data": {"tokenizer": str(vocab_path)}})
    ckpt.wait()


def test_the_cli_runs_amnesic_probing_and_patching_on_a_masked_lm_run(study, tmp_path, capsys):
  from jaxencoder.probing import __main__ as probe
  cfg, _, _, dataset, _ = study
  params = nn.meta.unbox(EncoderForMaskedLM(cfg).init(jax.random.key(3),
                                                      np.ones((1, 8), np.int32))["params"])
  (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  write_mlm_run(tmp_path / "run", cfg, params, tmp_path / "vocab.txt")
  data = tmp_path / "tags.txt"
  data.write_text("\n".join(" ".join(f"{w}/{t}" for w, t in zip(ws, ts))
                            for ws, ts in zip(dataset.sentences, dataset.labels)) + "\n")
  pairs = tmp_path / "pairs.jsonl"
  pairs.write_text(json.dumps({"clean": "the cat sat on a [MASK] .", "target_clean": "mat",
                               "corrupted": "the dog sat on a [MASK] .",
                               "target_corrupted": "fox"}) + "\n")
  out = tmp_path / "out"
  report = probe.main(["--checkpoint", str(tmp_path / "run"), "--data", str(data),
                       "--out", str(out), "--max-epochs", "5", "--no-control", "--amnesic",
                       "--patch", str(pairs)])
  rows = report["amnesic"]["layers"]
  assert len(rows) == cfg.num_layers
  assert set(rows[0]["objective_before"]) == {"loss", "accuracy"}
  assert {"objective_before", "objective_after", "objective_after_random",
          "probe_after"} <= set(rows[0])
  assert 0 < report["amnesic"]["majority"] < 1
  grid = np.array(report["patching"]["layer_position"], float)
  assert grid.shape == (cfg.num_layers, 9)
  assert np.array(report["patching"]["layer_head"]).shape == (cfg.num_layers, cfg.num_heads)
  for name in ("amnesic", "patching"):
    assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
  saved = json.loads((out / "report.json").read_text())
  assert saved["amnesic"]["layers"][0]["objective_after"]["loss"] == pytest.approx(
      rows[0]["objective_after"]["loss"])
  printed = capsys.readouterr().out
  assert "amnesic probing (masked LM loss and accuracy" in printed
  assert "activation patching (1 pairs)" in printed


def test_the_cli_names_the_input_without_a_head(study, tmp_path, capsys):
  from jaxencoder import pretrained
  from jaxencoder.probing import __main__ as probe
  cfg, params, tok, _, _ = study
  pretrained.save(tmp_path / "hf", cfg, params["encoder"], tok)
  (tmp_path / "d.txt").write_text("the/DET cat/NOUN\n" * 12)
  with pytest.raises(SystemExit):
    probe.main(["--pretrained", str(tmp_path / "hf"), "--data", str(tmp_path / "d.txt"),
                "--out", str(tmp_path / "out"), "--amnesic"])
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].endswith(f"--pretrained {tmp_path / 'hf'} has neither (an encoder without a "
                          "head, e.g. a BertModel)")


def tagged_lines(dataset: features.Dataset) -> str:
  return "\n".join(" ".join(f"{w}/{t}" for w, t in zip(ws, ts))
                   for ws, ts in zip(dataset.sentences, dataset.labels)) + "\n"


def amnesic_cli(source_flag, source, data, out, *extra):
  from jaxencoder.probing import __main__ as probe
  return probe.main([source_flag, str(source), "--data", str(data), "--out", str(out),
                     "--max-epochs", "5", "--no-control", "--amnesic", *extra])["amnesic"]


def test_a_converted_masked_lm_directory_scores_as_its_run(study, tmp_path):
  """jaxencoder-convert RUN -> a BertForMaskedLM directory; --amnesic on it equals the study
  of the run itself: the same masks, features, erasers and objective (loss and accuracy)."""
  from jaxencoder.pretrained.convert import convert
  cfg, _, _, dataset, _ = study
  params = nn.meta.unbox(EncoderForMaskedLM(cfg).init(jax.random.key(4),
                                                      np.ones((1, 8), np.int32))["params"])
  leaves, tree = jax.tree.flatten(params)  # every tensor (norm scales, biases) non-trivial
  noise = np.random.default_rng(0)
  params = jax.tree.unflatten(tree, [np.asarray(x) + noise.normal(0, 0.05, np.shape(x))
                                     .astype(np.float32) for x in leaves])
  (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  write_mlm_run(tmp_path / "run", cfg, params, tmp_path / "vocab.txt")
  convert(tmp_path / "run", tmp_path / "hf")
  hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
  assert hf_config["architectures"] == ["BertForMaskedLM"]
  data = tmp_path / "tags.txt"
  data.write_text(tagged_lines(dataset))
  run = amnesic_cli("--checkpoint", tmp_path / "run", data, tmp_path / "from_run")
  hf = amnesic_cli("--pretrained", tmp_path / "hf", data, tmp_path / "from_hf")
  assert hf["masked_tokens"] == run["masked_tokens"] > 0
  assert len(hf["layers"]) == len(run["layers"]) == cfg.num_layers
  for a, b in zip(hf["layers"], run["layers"]):
    assert a["rank"] == b["rank"]
    for key in ("objective_before", "objective_after", "objective_after_random"):
      assert set(a[key]) == {"loss", "accuracy"}
      for metric in ("loss", "accuracy"):
        assert a[key][metric] == pytest.approx(b[key][metric], abs=1e-5), (a["layer"], key)
  assert run["layers"][0]["objective_before"]["loss"] > 1.0  # a real loss, not a zero


CLASSES = ["VERB", "DET", "NOUN"]  # the run's class order (labels.txt), not the data's sorted


@pytest.fixture(scope="module")
def classifier_runs(tmp_path_factory):
  """A token_classify run trained on TAGS (classes in CLASSES order) and a classify run
  (labels no / yes), a few train.py steps each; with their probing data (the tagged
  sentences, a CSV of yes / no sentences)."""
  import types

  import train_helpers as th
  from jaxencoder.data import builders
  from jaxencoder.train.loop import train_and_evaluate
  root = tmp_path_factory.mktemp("classifier_runs")
  vocab = th.write_vocab(root)
  dataset = tagged(60, seed=3)
  (root / "tags").mkdir()
  (root / "tags" / "train.txt").write_text(tagged_lines(dataset))
  (root / "tags" / "labels.txt").write_text("\n".join(CLASSES) + "\n")
  tags = th.tiny_config(root, str(builders.prepare("tagged_tokens", root / "tags", root / "tfds",
                                                   name="tags")), vocab)
  tags.task, tags.data.kind = "token_classify", "tagged_tokens"
  train_and_evaluate(tags, root / "token_run")
  labels = th.tiny_config(root, th.classification_set(root), vocab)
  labels.task, labels.data.kind, labels.data.eval_split = ("classify", "text_classification",
                                                           "test")
  train_and_evaluate(labels, root / "classify_run")
  rng = np.random.default_rng(5)
  rows = [" ".join(rng.choice(WORDS, size=6)) for _ in range(40)]
  (root / "yes_no.csv").write_text("text,label\n" + "".join(
      f"{r},{'yes' if 'cat' in r.split() else 'no'}\n" for r in rows))
  return types.SimpleNamespace(root=root, dataset=dataset, tags=tags, labels=labels,
                               token_run=root / "token_run", classify_run=root / "classify_run",
                               tagged=root / "tags" / "train.txt", csv=root / "yes_no.csv")


def reference_loss(config, workdir, sentences, labels, token_level):
  """The classifier's mean cross-entropy on `sentences` (lists of vocab words, one class id
  per word or per sentence), one sentence at a time: [CLS] words [SEP], no padding."""
  import train_helpers as th
  from jaxencoder.train.config import encoder_config
  params = th.final_params(config, workdir)
  num_classes = params["head"]["classifier"]["kernel"].shape[-1]
  model = EncoderClassifier(encoder_config(config), num_classes, token_level=token_level)
  nll = []
  for words, label in zip(sentences, labels):
    ids_L = np.array([[VOCAB.index("[CLS]")] + [VOCAB.index(w) for w in words]
                      + [VOCAB.index("[SEP]")]], np.int32)
    logits = np.asarray(model.apply({"params": params}, ids_L,
                                    attention_mask=np.ones_like(ids_L)), np.float64)[0]
    logits_xC = logits[1:len(words) + 1] if token_level else logits[None]
    logp_xC = logits_xC - np.log(np.exp(logits_xC).sum(-1, keepdims=True))
    nll.extend(-logp_xC[np.arange(len(logp_xC)), np.atleast_1d(label)])
  return float(np.mean(nll))


def held_out_sentences(sentence_lengths, count=256):
  """The test-split sentences amnesic probing scores (amnesic.held_out with the CLI's seed)."""
  ids_M = np.repeat(np.arange(len(sentence_lengths)), sentence_lengths)
  return np.unique(ids_M[probes.split_items(ids_M, seed=0)["test"]])[:count]


@pytest.mark.slow
def test_a_token_classifier_run_is_scored_by_its_own_loss_on_its_own_class_order(
    classifier_runs, tmp_path):
  runs = classifier_runs
  result = amnesic_cli("--checkpoint", runs.token_run, runs.tagged, tmp_path / "out")
  assert result["objective"] == "classifier loss"
  for row in result["layers"]:
    for key in ("objective_before", "objective_after", "objective_after_random"):
      assert isinstance(row[key], float) and np.isfinite(row[key])
  sentences = held_out_sentences([len(s) for s in runs.dataset.sentences])
  assert result["sentences"] == len(sentences)
  words = [runs.dataset.sentences[s] for s in sentences]
  tags = [[CLASSES.index(t) for t in runs.dataset.labels[s]] for s in sentences]
  want = reference_loss(runs.tags, runs.token_run, words, tags, token_level=True)
  assert result["layers"][0]["objective_before"] == pytest.approx(want, rel=1e-4)
  sorted_ids = [[sorted(CLASSES).index(t) for t in runs.dataset.labels[s]] for s in sentences]
  assert abs(reference_loss(runs.tags, runs.token_run, words, sorted_ids, True) - want) > 1e-2


@pytest.mark.slow
def test_a_classify_run_is_scored_on_its_labels_and_refuses_others_in_one_line(
    classifier_runs, tmp_path, capsys):
  from jaxencoder.probing import __main__ as probe
  runs = classifier_runs
  result = amnesic_cli("--checkpoint", runs.classify_run, runs.csv, tmp_path / "out")
  rows = [line.split(",") for line in runs.csv.read_text().splitlines()[1:]]
  sentences = held_out_sentences([1] * len(rows))
  want = reference_loss(runs.labels, runs.classify_run, [rows[s][0].split() for s in sentences],
                        [["no", "yes"].index(rows[s][1]) for s in sentences], token_level=False)
  assert result["objective"] == "classifier loss"
  assert result["layers"][0]["objective_before"] == pytest.approx(want, rel=1e-4)
  capsys.readouterr()
  with pytest.raises(SystemExit):  # the tags are no classes of a yes / no classifier
    probe.main(["--checkpoint", str(runs.classify_run), "--data", str(runs.tagged),
                "--out", str(tmp_path / "tags_out"), "--amnesic"])
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].endswith("--amnesic: the data's labels ['DET', 'NOUN', 'VERB'] are not "
                          "classes of the classifier (no, yes); score it on its own labels")
