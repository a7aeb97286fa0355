"""Fault injection: a run stopped or damaged at any point loses nothing past its last
durable checkpoint, says so truthfully, and exits with a code a scheduler can act on."""

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

import train_helpers as th
from jaxencoder.io.checkpoint import CheckpointError
from jaxencoder.io.run_dir import RunDir, read_metrics
from jaxencoder.train import loop, resume
from jaxencoder.train.stop import EXIT_PREEMPTED, Preempted

REPO = pathlib.Path(__file__).resolve().parents[1]
STOP_AT = 4  # the step whose phase receives the signal


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  return root, th.text_corpus(root), th.write_vocab(root)


def long_config(corpus, steps=200):
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.num_train_steps, config.log_every, config.eval_every = steps, 2, STOP_AT
  config.checkpoint_every = 1000  # no interval save before the signal
  return config


def signal_self(signum=signal.SIGTERM):
  os.kill(os.getpid(), signum)


def after(fn, when):
  """fn, sending SIGTERM to this process once `when(args)` holds (after fn ran)."""
  sent = []
  def wrapped(*args, **kwargs):
    out = fn(*args, **kwargs)
    if not sent and when(*args, **kwargs):
      sent.append(True)
      signal_self()
    return out
  return wrapped


def before(fn, when, signum=signal.SIGTERM):
  """fn, sending `signum` to this process once, before the call where `when(args)` holds."""
  sent = []
  def wrapped(*args, **kwargs):
    if not sent and when(*args, **kwargs):
      sent.append(True)
      signal_self(signum)
    return fn(*args, **kwargs)
  return wrapped


class SignallingIterator:
  """A data iterator that receives SIGTERM while producing batch `at` (1-based)."""

  def __init__(self, inner, at):
    self.inner, self.at, self.count = inner, at, 0

  def __next__(self):
    self.count += 1
    if self.count == self.at:
      signal_self()
    return next(self.inner)

  def __iter__(self):
    return self

  def get_state(self):
    return self.inner.get_state()

  def set_state(self, state):
    self.inner.set_state(state)


def inject(monkeypatch, phase):
  at_step = lambda run, *a, **k: int(run.state.step) == STOP_AT
  if phase == "eval":
    monkeypatch.setattr(loop, "evaluate", before(loop.evaluate, at_step))
  elif phase == "logging":
    monkeypatch.setattr(loop, "_log_train", after(loop._log_train, lambda run, w, done, *a: done == STOP_AT))
  elif phase == "async save in flight":
    monkeypatch.setattr(loop, "save", after(loop.save, at_step))
  elif phase == "data loading":
    setup = loop.setup
    def signalling_setup(*args, **kwargs):
      run = setup(*args, **kwargs)
      run.train_iter = SignallingIterator(run.train_iter, STOP_AT + 1)  # +1: the loop peeks once
      return run
    monkeypatch.setattr(loop, "setup", signalling_setup)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["data loading", "logging", "eval", "async save in flight"])
def test_sigterm_in_any_phase_saves_the_finished_step_and_resumes(corpus, tmp_path, monkeypatch,
                                                                  phase):
  inject(monkeypatch, phase)
  config = long_config(corpus)
  if phase == "async save in flight":
    config.checkpoint_every = STOP_AT
  with pytest.raises(Preempted) as stopped:
    loop.train_and_evaluate(config, tmp_path)
  monkeypatch.undo()
  durable = STOP_AT
  if phase == "data loading":  # the prefetch thread reads ahead (a queue of 2 and the batch
    # it holds while the queue is full): the signal comes while an earlier step runs, and
    # that step is saved
    durable = stopped.value.step
    assert STOP_AT - 3 <= durable <= STOP_AT
  assert stopped.value.step == durable and stopped.value.signal_name == "SIGTERM"
  assert f"step {durable} is saved in" in str(stopped.value)
  assert RunDir.open(tmp_path).latest_step() == durable  # durable: the message is true
  # Resuming continues from that step: no step is trained or logged twice.
  loop.train_and_evaluate(long_config(corpus, steps=durable + 3), tmp_path)
  train_steps = [r["step"] for r in read_metrics(tmp_path) if r["split"] == "train"]
  assert train_steps == sorted(set(train_steps)) and train_steps[-1] == durable + 3


@pytest.mark.slow
def test_sigint_also_stops_with_a_checkpoint(corpus, tmp_path, monkeypatch):
  at_step = lambda run, *a, **k: int(run.state.step) == STOP_AT
  monkeypatch.setattr(loop, "evaluate", before(loop.evaluate, at_step, signal.SIGINT))
  with pytest.raises(Preempted) as stopped:
    loop.train_and_evaluate(long_config(corpus), tmp_path)
  assert stopped.value.signal_name == "SIGINT" and stopped.value.step == STOP_AT


@pytest.mark.slow
def test_train_py_sigterm_after_a_log_line_exits_75_with_the_saved_step(corpus, tmp_path):
  """The reported case: eval every 10 steps, checkpoints every 1000, SIGTERM right after
  the step-10 train log line (`step 10/100000: loss ...`)."""
  root, source, vocab = corpus
  overrides = {"data.source": source, "data.data_dir": root, "data.tokenizer": vocab,
               "data.seq_len": 16, "model.num_layers": 1, "model.emb_dim": 32,
               "model.num_heads": 4, "model.mlp_dim": 64, "model.max_len": 32,
               "model.vocab_size": len(th.VOCAB), "num_train_steps": 100_000, "batch_size": 8,
               "eval_batch_size": 8, "log_every": 10, "eval_every": 10,
               "checkpoint_every": 1000, "progress_bar": "false"}
  command = [sys.executable, str(REPO / "train.py"), "--config", str(REPO / "configs/mlm_tiny.py"),
             "--workdir", str(tmp_path / "run")] + [f"--config.{k}={v}" for k, v in overrides.items()]
  proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
  lines = []
  try:
    for line in proc.stderr:
      lines.append(line)
      if "step 10/100000:" in line:
        proc.send_signal(signal.SIGTERM)
        break
    rest = proc.communicate(timeout=180)[1]
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == EXIT_PREEMPTED, "".join(lines)[-3000:] + rest[-3000:]
  saved = RunDir.open(tmp_path / "run").latest_step()
  assert saved >= 10 and f"step {saved} is saved in" in rest


# Damaged checkpoints.

def short_config(corpus, steps=6):
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab)
  config.num_train_steps, config.checkpoint_every, config.eval_every = steps, 2, steps
  config.keep_checkpoints = 10
  return config


def array_files(step_dir: pathlib.Path) -> list[pathlib.Path]:
  """The state's OCDBT data files. Every one is damaged: which file holds which array is
  orbax's business (damaging only the largest once hit a file the restore did not read)."""
  return [p for p in (step_dir / "state").rglob("*") if p.is_file() and "/d/" in str(p)]


DAMAGE = {
    "truncated array file": lambda d: [p.write_bytes(p.read_bytes()[:16]) for p in array_files(d)],
    "overwritten array file": lambda d: [p.write_bytes(b"\0" * p.stat().st_size)
                                         for p in array_files(d)],
    "state/ removed": lambda d: __import__("shutil").rmtree(d / "state"),
    "empty step directory": lambda d: [__import__("shutil").rmtree(p) if p.is_dir() else p.unlink()
                                       for p in list(d.iterdir())],
}


TRAIN_IN_SUBPROCESS = """
import sys
sys.path.insert(0, {tests!r})
import pathlib, test_faults
from jaxencoder.train import loop, resume
config = test_faults.short_config((pathlib.Path({root!r}), {source!r}, pathlib.Path({vocab!r})),
                                  steps={steps})
loop.train_and_evaluate(config, {workdir!r})
"""


def train_elsewhere(corpus, workdir, steps):
  """Trains in another process: tensorstore caches what this process wrote, so a restore
  here would read the cache, not the damaged files (a new process, as on resume, reads disk)."""
  root, source, vocab = corpus
  code = TRAIN_IN_SUBPROCESS.format(tests=str(REPO / "tests"), root=str(root), source=source,
                                    vocab=str(vocab), steps=steps, workdir=str(workdir))
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_step(corpus, tmp_path, damage,
                                                                     caplog):
  train_elsewhere(corpus, tmp_path, steps=4)  # saves steps 2 and 4
  DAMAGE[damage](tmp_path / "checkpoints" / "4")
  with caplog.at_level("INFO", logger="jaxencoder"):
    loop.train_and_evaluate(short_config(corpus, steps=6), tmp_path)
  warnings = [r.getMessage() for r in caplog.records if "cannot be restored" in r.getMessage()]
  assert len(warnings) == 1 and warnings[0].startswith("checkpoint step 4 in")
  assert any("resumed from step 2" in r.getMessage() for r in caplog.records)
  run = RunDir.open(tmp_path)
  assert run.steps()[-1] == 6 and (tmp_path / "checkpoints" / "4.unrestorable").is_dir()
  train_steps = [r["step"] for r in read_metrics(tmp_path) if r["split"] == "train"]
  assert train_steps == list(range(1, 7))  # steps 3, 4 retrained and logged once


@pytest.mark.slow
def test_no_restorable_checkpoint_is_an_error_not_a_fresh_start(corpus, tmp_path):
  loop.train_and_evaluate(short_config(corpus, steps=4), tmp_path)
  for step in (2, 4):
    DAMAGE["state/ removed"](tmp_path / "checkpoints" / str(step))
  with pytest.raises(CheckpointError, match=r"no restorable checkpoint in .*step 4: .*step 2: "):
    loop.train_and_evaluate(short_config(corpus, steps=6), tmp_path)
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2", "4"]


# Config changes on resume.

@pytest.mark.slow
def test_resuming_with_another_model_names_the_fields(corpus, tmp_path):
  loop.train_and_evaluate(short_config(corpus, steps=2), tmp_path)
  changed = short_config(corpus, steps=4)
  changed.model.num_heads, changed.optim.name = 2, "lion"
  with pytest.raises(resume.ConfigChangedError,
                     match=r"model.num_heads: 4 -> 2; optim.name: 'adamw' -> 'lion'\. Use a new"):
    loop.train_and_evaluate(changed, tmp_path)


@pytest.mark.slow
def test_resuming_with_a_longer_schedule_warns_and_continues(corpus, tmp_path, caplog):
  loop.train_and_evaluate(short_config(corpus, steps=2), tmp_path)
  longer = short_config(corpus, steps=4)
  longer.optim.learning_rate = 1e-3
  with caplog.at_level("WARNING", logger="jaxencoder"):
    loop.train_and_evaluate(longer, tmp_path)
  message = next(r.getMessage() for r in caplog.records if "changed settings" in r.getMessage())
  assert "num_train_steps: 2 -> 4" in message and "optim.learning_rate: 0.003 -> 0.001" in message
  assert RunDir.open(tmp_path).latest_step() == 4


# Bad input on the command line: one line on stderr, exit code 2, no traceback.

def train_py(tmp_path, *args, config="configs/mlm_tiny.py"):
  command = [sys.executable, str(REPO / "train.py"), "--config", str(REPO / config)
             if not pathlib.Path(config).is_absolute() else config,
             "--workdir", str(tmp_path / "run"), *args]
  return subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("args,message", [
    (["--config.log_every=0"], "error: log_every must be a positive integer, got 0"),
    (["--config.checkpoint_every=0"], "error: checkpoint_every must be a positive integer"),
    (["--config.batchsize=3"], "error: unknown config key 'batchsize'"),
    (["--config.init_from=/nonexistent/run"], "error: /nonexistent/run: no checkpoint here"),
])
def test_bad_flags_print_one_line_and_exit_2(tmp_path, args, message):
  result = train_py(tmp_path, *args)
  assert result.returncode == 2, result.stderr[-2000:]
  assert message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_json_config_file_is_refused_by_name(tmp_path):
  (tmp_path / "c.json").write_text("{}")
  result = train_py(tmp_path, config=str(tmp_path / "c.json"))
  assert result.returncode == 2 and "expected a Python config file" in result.stderr
  assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_run_shorter_than_its_warmup_trains_with_a_clipped_warmup(corpus, tmp_path, caplog):
  config = short_config(corpus, steps=3)
  config.optim.warmup_steps = 100
  with caplog.at_level("WARNING", logger="jaxencoder"):
    loop.train_and_evaluate(config, tmp_path)
  assert any("warmup_steps=100 is not shorter than the 3-step schedule; using 0" in r.getMessage()
             for r in caplog.records)
  assert RunDir.open(tmp_path).latest_step() == 3


@pytest.mark.slow
def test_the_config_checked_on_resume_is_that_of_the_step_restored(corpus, tmp_path):
  """Step 4 damaged and saved with another mask rate; step 2 intact and saved with this
  config: the run resumes from step 2, checked against step 2's config (reading step 4's
  would refuse the resume for a config nobody restores)."""
  train_elsewhere(corpus, tmp_path, steps=4)
  step_4 = tmp_path / "checkpoints" / "4"
  (saved,) = [p for p in (step_4 / "config").rglob("*") if p.is_file() and
              b"mask_rate" in p.read_bytes()]
  stored = json.loads(saved.read_text())
  stored["data"]["mask_rate"] = 0.5
  saved.write_text(json.dumps(stored))
  DAMAGE["truncated array file"](step_4)
  loop.train_and_evaluate(short_config(corpus, steps=6), tmp_path)
  assert RunDir.open(tmp_path).steps()[-1] == 6
  assert (tmp_path / "checkpoints" / "4.unrestorable").is_dir()
