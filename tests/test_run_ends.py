"""A run's two ends: a finished run's rerun exits at once, saying so, with nothing
compiled, evaluated or written; a run that fails before its first checkpoint removes the
run directory it made (never one that was there, never a file the user put there)."""

import logging
import pathlib
from types import SimpleNamespace

import pytest

import train_helpers as th
from jaxencoder.train import finished, loop
from jaxencoder.train.config import base_config
from jaxencoder.train.__main__ import main as train_main

TESTS = pathlib.Path(__file__).resolve().parent


def run_dir(step, rows=(), path="runs/a"):
  """The few RunDir reads done_line makes."""
  return SimpleNamespace(path=path, latest_step=lambda: step, read_metrics=lambda: list(rows))


def config(steps=10, patience=0):
  c = base_config()
  c.num_train_steps, c.early_stopping_patience, c.best_metric = steps, patience, "loss"
  return c


def test_a_run_at_its_last_step_is_done_and_one_short_of_it_is_not():
  assert finished.done_line(config(10), run_dir(10)) == (
      "runs/a is done at step 10 of 10: nothing trained or evaluated again "
      "(a larger num_train_steps trains on)")
  assert finished.done_line(config(10), run_dir(8)) is None
  assert finished.done_line(config(10), run_dir(None)) is None


def test_an_early_stopped_run_is_done_and_says_why():
  rows = [{"step": s, "split": "eval", "loss": v} for s, v in ((2, 1.0), (4, 1.5), (6, 1.2))]
  line = finished.done_line(config(10, patience=2), run_dir(6, rows))
  assert line == ("runs/a is done at step 6 of 10, stopped early: eval loss has not improved "
                  "on 1 (step 2) for 2 evals (early_stopping_patience=2)")
  assert finished.done_line(config(10, patience=3), run_dir(6, rows)) is None


def fail_writing(workdir, *extra):
  """A run that wrote its first files, then failed."""
  with pytest.raises(RuntimeError), finished.removed_if_unfinished(workdir):
    workdir.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.jsonl", "run_record.json", "vocab.txt", *extra):
      (workdir / name).write_text("{}\n")
    (workdir / "tensorboard").mkdir()
    (workdir / "tensorboard" / "events.out").write_text("x")
    (workdir / "checkpoints").mkdir()
    raise RuntimeError("failed before its first checkpoint")


def test_a_failed_first_try_removes_the_directory_it_made(tmp_path):
  fail_writing(tmp_path / "run")
  assert list(tmp_path.iterdir()) == []


def test_a_directory_that_was_there_is_left_as_it_was_left(tmp_path):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("mine")
  fail_writing(workdir)
  assert (workdir / "notes.txt").read_text() == "mine"
  assert (workdir / "metrics.jsonl").exists()  # not ours to judge: an older run's, maybe


def test_a_file_the_user_put_in_the_new_directory_stays_with_it(tmp_path):
  workdir = tmp_path / "run"
  fail_writing(workdir, "notes.txt")
  assert sorted(p.name for p in workdir.iterdir()) == ["notes.txt"]


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  """A configs/*.py file for the tiny MLM run of train_helpers."""
  root = tmp_path_factory.mktemp("data")
  source, vocab = th.text_corpus(root), th.write_vocab(root)
  path = root / "tiny.py"
  path.write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
                  "import pathlib\nimport train_helpers as th\n\n\ndef get_config():\n"
                  f"  return th.tiny_config(pathlib.Path({str(root)!r}), {source!r}, "
                  f"pathlib.Path({str(vocab)!r}))\n")
  return path


@pytest.mark.slow
def test_a_finished_run_rerun_exits_at_once_saying_it_is_done(config_file, tmp_path, capsys,
                                                              monkeypatch):
  workdir = tmp_path / "run"
  train_main(["--config", str(config_file), "--workdir", str(workdir)])
  first = capsys.readouterr()
  metrics = (workdir / "metrics.jsonl").read_bytes()
  monkeypatch.setattr(loop, "setup", lambda *a, **k: pytest.fail("a finished run set up"))
  train_main(["--config", str(config_file), "--workdir", str(workdir)])  # no SystemExit: 0
  again = capsys.readouterr()
  assert f"{workdir} is done at step 6 of 6: nothing trained or evaluated again" in again.err
  assert "compiling" not in again.err and "step 6 eval" not in again.err
  assert again.out == first.out  # the same "final eval: ..." line
  assert (workdir / "metrics.jsonl").read_bytes() == metrics


@pytest.mark.slow
@pytest.mark.parametrize("existed", [False, True])
def test_a_run_failing_before_its_first_checkpoint_removes_only_the_directory_it_made(
    config_file, tmp_path, monkeypatch, existed):
  workdir = tmp_path / "runs" / "run"
  if existed:
    workdir.mkdir(parents=True)
    (workdir / "notes.txt").write_text("mine")

  def fail(*args, **kwargs):
    raise RuntimeError("failed in the first step")
  monkeypatch.setattr(loop, "_steps", fail)
  monkeypatch.setenv("JAXENCODER_TRACEBACK", "1")
  with pytest.raises(RuntimeError):
    train_main(["--config", str(config_file), "--workdir", str(workdir)])
  if existed:
    assert (workdir / "notes.txt").read_text() == "mine"
  else:
    assert list(tmp_path.iterdir()) == []  # runs/ too: the command made it


@pytest.mark.slow
def test_a_finished_run_rerun_with_another_model_is_refused_not_done(config_file, tmp_path):
  from jaxencoder.train import resume
  from jaxencoder.train.config_file import load_config
  workdir = tmp_path / "run"
  config = load_config(str(config_file))
  loop.train_and_evaluate(config, workdir)
  config.model.num_heads = 2
  with pytest.raises(resume.ConfigChangedError, match=r"model.num_heads: 4 -> 2"):
    loop.train_and_evaluate(config, workdir)
