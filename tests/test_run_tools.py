"""Looking at a finished run: eval-only, predictions, metric plots."""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

import train_helpers as th
from jaxencoder.model.restore_targets import stored_config, stored_encoder
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


PREDICT_LINES = ["the cat sat", "a dog ran far away from the red house", "cat", "the red dog",
                 "a house", "the cat ran away", "dog"]


@pytest.mark.slow
def test_batch_size_one_and_three_give_the_same_predictions_and_scores(classify_run):
  root, _ = classify_run
  p = predict.load(root / "run")
  one = predict.predictions(p, PREDICT_LINES, batch_size=1, scores=True)
  three = predict.predictions(p, PREDICT_LINES, batch_size=3, scores=True)
  assert one.outputs == three.outputs
  np.testing.assert_allclose(one.scores_NxC, three.scores_NxC, atol=1e-6)


def run_predict(root, tmp_path, *flags) -> None:
  """Runs jaxencoder-predict (in this process) on PREDICT_LINES with `flags`."""
  source = tmp_path / "in.txt"
  source.write_text("\n".join(PREDICT_LINES) + "\n")
  predict.main(["--run", str(root / "run"), "--input", str(source), *flags])


@pytest.mark.slow
def test_jsonl_has_one_object_per_input_with_probabilities_summing_to_one(classify_run,
                                                                         tmp_path):
  import json
  root, _ = classify_run
  run_predict(root, tmp_path, "--out", str(tmp_path / "out.jsonl"), "--scores",
              "--batch-size", "2")
  records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
  assert [r["input"] for r in records] == PREDICT_LINES
  for r in records:
    assert list(r["scores"]) == ["no", "yes"]
    assert sum(r["scores"].values()) == pytest.approx(1.0, abs=1e-9)
    assert r["prediction"] == max(r["scores"], key=r["scores"].get)


@pytest.mark.slow
def test_text_scores_are_columns_named_by_the_classes(classify_run, tmp_path):
  root, _ = classify_run
  run_predict(root, tmp_path, "--out", str(tmp_path / "out.tsv"), "--scores")
  header, *rows = (tmp_path / "out.tsv").read_text().splitlines()
  assert header.split("\t") == ["prediction", "no", "yes", "input"]
  assert [row.split("\t")[3] for row in rows] == PREDICT_LINES
  for row in rows:
    label, no, yes, _ = row.split("\t")
    assert float(no) + float(yes) == pytest.approx(1.0, abs=2e-6)
    assert label == ("yes" if float(yes) > float(no) else "no")


@pytest.mark.slow
def test_predict_reports_each_batch_on_stderr(classify_run, tmp_path, capsys, monkeypatch):
  monkeypatch.setenv("JAXENCODER_PROGRESS", "lines")
  root, _ = classify_run
  run_predict(root, tmp_path, "--batch-size", "2")
  out = capsys.readouterr()
  assert [line.split(",")[0] for line in out.err.splitlines() if line.startswith("predicting")
          ] == [f"predicting: {k}/4 batch" for k in (1, 2, 3, 4)]
  assert [line.split("\t", 1)[1] for line in out.out.splitlines()] == PREDICT_LINES


@pytest.mark.slow
def test_scores_of_an_embedding_run_are_refused_and_jsonl_holds_its_vectors(mlm_run, tmp_path):
  import json
  p = predict.load(mlm_run.workdir)
  with pytest.raises(ValueError, match=r"--scores: a 'mlm' run has no per-class scores"):
    predict.predictions(p, ["the cat sat"], scores=True)
  source = tmp_path / "in.txt"
  source.write_text("the cat sat\na dog\n")
  predict.main(["--run", str(mlm_run.workdir), "--input", str(source), "--format", "jsonl",
                "--out", str(tmp_path / "vectors.txt")])
  records = [json.loads(line) for line in (tmp_path / "vectors.txt").read_text().splitlines()]
  np.testing.assert_allclose([r["prediction"] for r in records],
                             predict.predict(p, ["the cat sat", "a dog"]), atol=1e-6)


@pytest.mark.slow
def test_embeddings_of_an_mlm_run_are_its_pooled_encoder_outputs(mlm_run):
  config = mlm_run.config
  p = predict.load(mlm_run.workdir)
  vectors_NxD = predict.predict(p, ["the cat sat", "a dog"])
  run = RunDir.open(mlm_run.workdir)
  batch = p.tokenizer.encode_batch(["the cat sat"])
  expected = Encoder(stored_config(run)).apply({"params": stored_encoder(run)},
                                               batch["input_ids"], batch["attention_mask"])
  np.testing.assert_allclose(vectors_NxD[0], np.asarray(expected.pooled[0]), atol=1e-5)
  assert vectors_NxD.shape == (2, config.model.emb_dim)


@pytest.mark.slow
def test_plots_of_the_logged_metrics(classify_run, tmp_path):
  root, _ = classify_run
  paths = plots.plot_metrics(root / "run", tmp_path)
  assert sorted(p.name for p in paths) == ["accuracy.png", "f1_macro.png", "grad_norm.png",
                                           "learning_rate.png", "loss.png", "tokens_per_s.png"]
  assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)
  config = plots.run_config(root / "run")  # the stored config's schedule, at every step
  lr = plots.figures(read_metrics(root / "run"), config)["learning_rate"].axes[0]
  assert [l.get_label() for l in lr.lines] == [plots.SCHEDULE, "train"]
  assert list(lr.lines[0].get_xdata()) == list(range(1, config["num_train_steps"] + 1))


@pytest.mark.slow
def test_eval_only_reports_the_stored_run_without_writing(classify_run):
  root, metrics = classify_run
  before = read_metrics(root / "run")
  result = subprocess.run([sys.executable, str(REPO / "train.py"), "--workdir", str(root / "run"),
                           "--eval_only"], capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"accuracy={metrics['accuracy']:.4f}" in result.stdout
  assert read_metrics(root / "run") == before


# --- predict: row i is line i -------------------------------------------------------------
def untrained_run(root: pathlib.Path, task: str) -> pathlib.Path:
  """A run holding an untrained `task` model (step 1) and its config: all predict reads,
  written in a second instead of trained."""
  import flax.linen as nn
  import jax

  from jaxencoder.model.config import EncoderConfig
  from jaxencoder.io.checkpoint import Checkpointer, to_json
  from jaxencoder.tasks import registry
  root.mkdir(parents=True)
  config = th.tiny_config(root, "unused", th.write_vocab(root))
  config.task = task
  stored = to_json(config)
  cfg = EncoderConfig.from_dict(stored["model"])
  model = registry.task_from_config(stored, cfg, num_classes=2).model
  variables = jax.jit(model.init)(jax.random.key(0), np.ones((1, 8), np.int32))
  with Checkpointer(root / "run" / "checkpoints", save_interval_steps=1,
                    max_to_keep=None) as ckpt:
    ckpt.save(1, {"params": nn.meta.unbox(variables["params"])}, config=stored, force=True)
    ckpt.wait()
  return root / "run"


@pytest.fixture(scope="module")
def untrained_runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("untrained")
  return {task: untrained_run(root / task, task) for task in ("classify", "mlm")}


LINES_WITH_BLANKS = ["the cat sat", "", "a dog ran far away", " \t ", "cat"]  # 2 blank
BLANK = [not line.strip() for line in LINES_WITH_BLANKS]


def predict_file(run, tmp_path, name, lines, *flags, out_name):
  """jaxencoder-predict (in this process) on a file of `lines`; the output file's path."""
  source = tmp_path / f"{name}.txt"
  source.write_text("".join(line + "\n" for line in lines))
  out = tmp_path / f"{name}_{out_name}"
  predict.main(["--run", str(run), "--input", str(source), "--out", str(out), *flags])
  return out


@pytest.mark.parametrize("task, flags, out_name", [
    ("classify", (), "out.txt"), ("classify", ("--scores",), "out.tsv"),
    ("classify", ("--scores",), "out.jsonl"), ("mlm", (), "out.npy"), ("mlm", (), "out.jsonl")])
def test_blank_lines_keep_their_rows_in_every_output_format(untrained_runs, tmp_path, task,
                                                            flags, out_name):
  import json
  run = untrained_runs[task]
  kept = [line for line in LINES_WITH_BLANKS if line.strip()]
  with_blanks = predict_file(run, tmp_path, "blanks", LINES_WITH_BLANKS, *flags,
                             out_name=out_name)
  alone = predict_file(run, tmp_path, "alone", kept, *flags, out_name=out_name)
  if out_name.endswith(".npy"):
    rows, expected = np.load(with_blanks), iter(np.load(alone))
    assert rows.shape == (5, 32)
    for row, blank in zip(rows, BLANK):
      np.testing.assert_array_equal(row, np.full(32, np.nan) if blank else next(expected))
    return
  rows = with_blanks.read_text().splitlines()
  expected = iter(alone.read_text().splitlines())
  if "--scores" in flags and out_name.endswith(".tsv"):  # a header naming the columns
    assert rows.pop(0) == next(expected) == "prediction\t0\t1\tinput"
  assert len(rows) == 5
  for row, line, blank in zip(rows, LINES_WITH_BLANKS, BLANK):
    if not blank:
      assert row == next(expected)
    elif out_name.endswith(".jsonl"):
      assert json.loads(row) == {"input": line, "blank": True}
    else:
      assert row == ("\tnan\tnan\t" + line if flags else "")


def test_blank_lines_are_not_run_through_the_model(untrained_runs, monkeypatch):
  p = predict.load(untrained_runs["mlm"])
  encoded, encode = [], predict._encode

  def recording(p, lines):
    encoded.extend(lines)
    return encode(p, lines)
  monkeypatch.setattr(predict, "_encode", recording)
  result = predict.predictions(p, LINES_WITH_BLANKS, batch_size=2)
  assert encoded == ["the cat sat", "a dog ran far away", "cat"]
  assert list(result.blank_N) == BLANK
  nan_rows = np.isnan(result.outputs).all(axis=1)
  assert list(nan_rows) == BLANK and not np.isnan(result.outputs[~nan_rows]).any()


def test_input_lines_are_split_at_line_ends_only(tmp_path):
  source = tmp_path / "in.txt"
  source.write_bytes("a\u2028b\x0cc\r\n\r\nd\n".encode())  # U+2028, a form feed: inside a line
  assert predict.read_lines(source) == ["a\u2028b\x0cc", "", "d"]
  source.write_bytes(b"a\n\n")
  assert predict.read_lines(source) == ["a", ""]
  source.write_bytes(b"")
  assert predict.read_lines(source) == []
