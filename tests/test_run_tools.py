"""Looking at a finished run: eval-only, predictions, metric plots."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

import train_helpers as th
from jaxencoder.restore_targets import stored_encoder
from jaxencoder import Encoder
from jaxencoder.io.run_dir import RunDir, read_metrics
from jaxencoder.train import loop, plots, predict

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def classify_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("cls")
  vocab = th.write_vocab(root)
  config = th.tiny_config(root, th.classification_set(root), vocab)
  config.task, config.data.kind, config.data.eval_split = "classify", "text_classification", "test"
  config.num_train_steps, config.eval_every, config.checkpoint_every = 8, 8, 8
  metrics = loop.train_and_evaluate(config, root / "run")
  return root, metrics


@pytest.mark.slow
def test_predictions_agree_with_the_runs_own_eval(classify_run):
  root, metrics = classify_run
  rows = [line.rsplit(",", 1) for line in (root / "cls" / "test.csv").read_text().splitlines()[1:]]
  p = predict.load(root / "run")
  assert p.label_names == ["no", "yes"]
  predicted = predict.predict(p, [text for text, _ in rows])
  assert [line.split("\t", 1)[1] for line in predicted] == [text for text, _ in rows]
  accuracy = np.mean([line.split("\t")[0] == label for line, (_, label) in zip(predicted, rows)])
  assert accuracy == pytest.approx(metrics["accuracy"])  # same model, same 16 examples


@pytest.mark.slow
def test_a_prediction_does_not_depend_on_its_batch(classify_run):
  root, _ = classify_run
  p = predict.load(root / "run")
  lines = ["the cat sat", "a dog ran far away from the red house", "cat"]
  together = predict.predict(p, lines)
  alone = [predict.predict(p, [line])[0] for line in lines]
  assert together == alone


@pytest.mark.slow
def test_embeddings_of_an_mlm_run_are_its_pooled_encoder_outputs(mlm_run):
  config = mlm_run.config
  p = predict.load(mlm_run.workdir)
  vectors_NxD = predict.predict(p, ["the cat sat", "a dog"])
  run = RunDir.open(mlm_run.workdir)
  batch = p.tokenizer.encode_batch(["the cat sat"])
  expected = Encoder(run.model_config()).apply({"params": stored_encoder(run)},
                                               batch["input_ids"], batch["attention_mask"])
  np.testing.assert_allclose(vectors_NxD[0], np.asarray(expected.pooled[0]), atol=1e-5)
  assert vectors_NxD.shape == (2, config.model.emb_dim)


@pytest.mark.slow
def test_plots_of_the_logged_metrics(classify_run, tmp_path):
  root, _ = classify_run
  paths = plots.plot_metrics(root / "run", tmp_path)
  assert sorted(p.name for p in paths) == ["accuracy.png", "learning_rate.png", "loss.png"]
  assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


@pytest.mark.slow
def test_eval_only_reports_the_stored_run_without_writing(classify_run):
  root, metrics = classify_run
  before = read_metrics(root / "run")
  result = subprocess.run([sys.executable, str(REPO / "train.py"), "--workdir", str(root / "run"),
                           "--eval_only"], capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"accuracy={metrics['accuracy']:.4f}" in result.stdout
  assert read_metrics(root / "run") == before
