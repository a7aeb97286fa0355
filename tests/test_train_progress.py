"""What the training loop tells while it runs: a count of finished steps only, one plain
line per log_every in a log file, phase lines, and eval-only runs named as such."""

import io
import logging
import pathlib
import time
from types import SimpleNamespace

import jax
import ml_collections
import pytest

import train_helpers as th
from jaxencoder import progress
from jaxencoder.train import loop


class Sums:
  """A step's metric sums; the step counts as finished once something waits for them."""

  def __init__(self, step: int, finished: set):
    self.step, self.finished = step, finished

  def block_until_ready(self):
    self.finished.add(self.step)
    return self


class TruthfulBar(progress.Progress):
  """Fails as soon as it would count a step nobody has waited for."""

  def __init__(self, finished: set, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.finished = finished

  def update(self, n: int = 1) -> None:
    assert self.n + n <= len(self.finished), (self.n + n, sorted(self.finished))
    super().update(n)


class Stepper:
  """Dispatches steps without running them; records the bar's count at each dispatch."""

  def __init__(self, finished: set):
    self.finished, self.dispatched, self.counts = finished, 0, []
    self.state, self.flops = SimpleNamespace(step=0), None
    self.bar = None

  def step(self, batch):
    self.counts.append(self.bar.n)
    self.dispatched += 1
    return Sums(self.dispatched, self.finished)


class Prefetch:
  def __next__(self):
    return {}, {}

  def take_wait_seconds(self) -> float:
    return 0.0


def stub_run(num_train_steps: int, log_every: int):
  config = ml_collections.ConfigDict(dict(
      num_train_steps=num_train_steps, log_every=log_every, eval_every=1000,
      checkpoint_every=1000))
  return SimpleNamespace(config=config, state=SimpleNamespace(step=0),
                         checkpointer=SimpleNamespace(check=lambda: None),
                         writer=SimpleNamespace(write=lambda *args: None), patience=None)


@pytest.fixture
def stubbed_loop(monkeypatch):
  """loop's logging, eval and saving replaced: _log_train reads the window's sums back
  (as its device_get does), so those steps are finished."""
  def log_train(run, window, *args):
    for sums in window:
      jax.block_until_ready(sums)
    return time.perf_counter()
  monkeypatch.setattr(loop, "_log_train", log_train)
  monkeypatch.setattr(loop, "evaluate", lambda *args, **kwargs: {"loss": 1.0})
  monkeypatch.setattr(loop, "save", lambda *args, **kwargs: None)
  monkeypatch.setattr(loop.log, "info", lambda *args: None)
  monkeypatch.delenv("JAXENCODER_PROGRESS", raising=False)
  signals = SimpleNamespace(should_stop=lambda step: False, requested=lambda: False)
  return signals


def drive(signals, num_train_steps: int, log_every: int, stream):
  finished = set()
  stepper = Stepper(finished)
  bar = TruthfulBar(finished, num_train_steps, "train", unit="step", every=log_every,
                    stream=stream)
  stepper.bar = bar
  with bar:
    loop._steps(stub_run(num_train_steps, log_every), signals, stepper, None, None, bar,
                Prefetch())
    final = bar.n
  return stepper, final, finished


def test_the_bar_counts_only_finished_steps(stubbed_loop):
  stepper, final, finished = drive(stubbed_loop, 7, 3, io.StringIO())
  # Dispatching step k + 1 waits for step k; a logged step (3, 6) is read back at once.
  assert stepper.counts == [0, 0, 1, 3, 3, 4, 6]
  assert final == 7 and finished == set(range(1, 8))


def test_a_log_file_gets_one_line_per_log_every_and_one_at_the_end(stubbed_loop):
  out = io.StringIO()
  drive(stubbed_loop, 7, 3, out)
  lines = out.getvalue().splitlines()
  assert [line.split(",")[0] for line in lines] == [
      "train: 3/7 step", "train: 6/7 step", "train: 7/7 step"]
  assert all(" left" in line for line in lines[:2]) and " left" not in lines[2]
  assert "\r" not in out.getvalue()


class RestoringCheckpointer:
  directory = pathlib.PurePosixPath("run/checkpoints")

  def latest_step(self):
    return 5

  def restore_newest(self, abstract_state):
    return 5, {"step": 5}, None, {}


def test_eval_only_says_it_evaluates_the_step_not_that_it_resumed(monkeypatch, caplog):
  monkeypatch.setattr(loop.steps, "abstract_state", lambda *args, **kwargs: None)
  monkeypatch.setattr(loop, "check_config_unchanged", lambda *args: None)
  monkeypatch.setattr(loop, "restore_data_position", lambda *args: None)
  run = SimpleNamespace(config=ml_collections.ConfigDict(dict(progress_bar=False)),
                        checkpointer=RestoringCheckpointer(), task=None, tx=None, mesh=None,
                        rules=None, shardings=None, run_dir=None, train_iter=None,
                        pipelines=SimpleNamespace(train_workers=0))
  with caplog.at_level(logging.INFO, logger="jaxencoder"):
    loop.restore_or_init(run, None, evaluating=True)
    evaluating = [r.getMessage() for r in caplog.records]
    caplog.clear()
    loop.restore_or_init(run, None)
    resuming = [r.getMessage() for r in caplog.records]
  assert evaluating == ["evaluating step 5 (run/checkpoints/5)"]
  assert resuming == ["resumed from step 5 (run/checkpoints/5)"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  return root, th.text_corpus(root), th.write_vocab(root)


@pytest.mark.slow
def test_a_run_in_a_log_file_tells_its_phases_and_each_log_every_once(corpus, tmp_path,
                                                                      capsys, monkeypatch,
                                                                      caplog):
  monkeypatch.setenv("JAXENCODER_PROGRESS", "lines")
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.progress_bar, config.log_every = True, 2
  loop.train_and_evaluate(config, tmp_path)
  err = capsys.readouterr().err.splitlines()
  told = [line.split(":")[0] if ":" in line else line for line in err]
  assert told == ["initialising the model state...", "initialising the model state",
                  "compiling the train step...", "compiling the train step",
                  "train", "train", "train"]
  assert [line.split(",")[0] for line in err if line.startswith("train")] == [
      "train: 2/6 step", "train: 4/6 step", "train: 6/6 step"]
  loop.train_and_evaluate(config, tmp_path)  # finished: says so (a log record), nothing else
  assert capsys.readouterr().err == ""
  caplog.clear()  # the records of this call only (the resume above logs "resumed from")
  with caplog.at_level(logging.INFO, logger="jaxencoder"):
    loop.evaluate_run(None, tmp_path)
  said = [r.getMessage() for r in caplog.records]
  assert any(m.startswith("evaluating step 6 ") for m in said)
  assert not any("resumed from" in m for m in said)


@pytest.mark.slow
def test_a_logged_run_has_one_short_line_per_interval(corpus, tmp_path, capsys, caplog,
                                                      monkeypatch):
  """With INFO shown (the CLI), the log record is the interval's line: no bar line too."""
  monkeypatch.setenv("JAXENCODER_PROGRESS", "lines")
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.progress_bar, config.log_every = True, 2
  with caplog.at_level(logging.INFO, logger="jaxencoder"):
    loop.train_and_evaluate(config, tmp_path)
  assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("train")]
  said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
  intervals = [m for m in said if " eval " not in m]
  assert [m.split(":")[0] for m in intervals] == ["step 2/6", "step 4/6", "step 6/6"]
  assert all(len(m) <= 120 and " s/step" in m and "flops" not in m for m in intervals)
