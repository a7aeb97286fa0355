"""Signals: SIGTERM stops within a step of the one running when it came, and a second
Ctrl-C (even inside XLA's first compile) ends train.py with one line, never a crash."""

import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest

import train_helpers as th
from jaxencoder.io.run_dir import RunDir
from jaxencoder.train import loop, stop
from jaxencoder.train.stop import EXIT_INTERRUPTED, Preempted, StopSignals

REPO = pathlib.Path(__file__).resolve().parents[1]
SECOND_SIGINT = ("SIGINT again: stopped at once without saving; rerun the same command to "
                 "resume from the last checkpoint")


class Exited(Exception):
  pass


def fake_exit(code):
  raise Exited(code)


def test_a_second_sigint_from_train_py_exits_130_with_one_line(monkeypatch, capfd):
  monkeypatch.setattr(stop, "exit_on_second_interrupt", True)
  monkeypatch.setattr(stop.os, "_exit", fake_exit)
  with StopSignals() as signals, pytest.raises(Exited) as exited:
    os.kill(os.getpid(), signal.SIGINT)
    assert signals.received == "SIGINT"  # the first one only asks the loop to stop
    os.kill(os.getpid(), signal.SIGINT)
  assert exited.value.args == (EXIT_INTERRUPTED,)
  assert capfd.readouterr().err == SECOND_SIGINT + "\n"


def test_a_second_sigint_in_python_raises_keyboard_interrupt(monkeypatch):
  monkeypatch.setattr(stop, "exit_on_second_interrupt", False)  # as in a notebook
  monkeypatch.setattr(stop.os, "_exit", fake_exit)  # a notebook must survive it
  with StopSignals(), pytest.raises(KeyboardInterrupt):
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)


def test_two_sigterms_only_ask_to_stop(monkeypatch):
  monkeypatch.setattr(stop.os, "_exit", fake_exit)
  with StopSignals() as signals:
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
  assert signals.received == "SIGTERM"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  return root, th.text_corpus(root), th.write_vocab(root)


@pytest.mark.slow
def test_sigterm_saves_at_most_one_step_past_the_one_running(corpus, tmp_path, monkeypatch):
  """A model slow enough that dispatch could run ahead (it ran 5 steps ahead before the
  loop waited for the previous step); no log, eval or save syncs the loop meanwhile."""
  config = th.tiny_config(*corpus, num_layers=4, emb_dim=256, mlp_dim=1024)
  config.num_train_steps, config.log_every = 500, 1000
  config.eval_every = config.checkpoint_every = 1000
  dispatched, seen = [], {}

  def signal_later():
    time.sleep(0.1)
    ready = [sums["loss"].is_ready() for sums in dispatched]
    seen["running"] = ready.index(False) + 1 if False in ready else len(ready) + 1
    os.kill(os.getpid(), signal.SIGTERM)

  make_stepper = loop.make_stepper
  def recording_stepper(*args, **kwargs):
    stepper = make_stepper(*args, **kwargs)
    step = stepper.step
    def recorded(batch):
      dispatched.append(step(batch))
      if len(dispatched) == 20:
        threading.Thread(target=signal_later).start()
      return dispatched[-1]
    stepper.step = recorded
    return stepper
  monkeypatch.setattr(loop, "make_stepper", recording_stepper)
  with pytest.raises(Preempted) as stopped:
    loop.train_and_evaluate(config, tmp_path)
  assert seen["running"] <= stopped.value.step <= seen["running"] + 1
  assert RunDir.open(tmp_path).latest_step() == stopped.value.step


@pytest.mark.slow
def test_train_py_two_sigints_during_the_first_compile_exit_130_with_one_line(corpus,
                                                                              tmp_path):
  root, source, vocab = corpus
  overrides = {"data.source": source, "data.data_dir": root, "data.tokenizer": vocab,
               "data.seq_len": 16, "model.num_layers": 1, "model.emb_dim": 32,
               "model.num_heads": 4, "model.mlp_dim": 64, "model.max_len": 32,
               "model.vocab_size": len(th.VOCAB), "num_train_steps": 50, "batch_size": 8,
               "eval_batch_size": 8, "progress_bar": "false",
               "compilation_cache_dir": "none"}  # a cached compile would end too soon
  command = [sys.executable, str(REPO / "train.py"), "--config",
             str(REPO / "configs/mlm_tiny.py"), "--workdir", str(tmp_path / "run")]
  command += [f"--config.{k}={v}" for k, v in overrides.items()]
  proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
  lines = []
  try:
    for line in proc.stderr:
      lines.append(line)
      if "fresh run in" in line:  # the first compiles come next (about 8 s on 2 cores)
        break
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    rest = proc.communicate(timeout=180)[1]
  finally:
    if proc.poll() is None:
      proc.kill()
  assert proc.returncode == EXIT_INTERRUPTED, "".join(lines)[-3000:] + rest[-3000:]
  assert rest.splitlines() == [SECOND_SIGINT]  # nothing else: no traceback
  assert "compiled in" not in "".join(lines) + rest  # it was stopped inside the compile
