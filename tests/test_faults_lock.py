"""One trainer per run directory (WORKDIR/lock.json); eval-only and predict read a run,
even a read-only one, and skip a damaged newest checkpoint as training does."""

import hashlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

import train_helpers as th
from gcs_emulator import gcs  # noqa: F401 (fixture)
from jaxencoder import cli
from jaxencoder.io import run_lock
from jaxencoder.io.run_dir import RunDir, read_metrics
from jaxencoder.io.run_lock import LOCK, RunDirLockedError, RunLock

REPO = pathlib.Path(__file__).resolve().parents[1]


def write_lock(workdir: pathlib.Path, **fields) -> dict:
  """A lock.json of another trainer (this host, a live pid, a fresh heartbeat unless
  `fields` say otherwise)."""
  now = time.time()
  record = dict(host=socket.gethostname(), pid=os.getpid(), started=now - 60, heartbeat=now,
                token="theirs")
  record.update(fields)
  workdir.mkdir(parents=True, exist_ok=True)
  (workdir / LOCK).write_text(json.dumps(record))
  return record


def test_a_second_trainer_is_refused_naming_the_holder(tmp_path):
  first = RunLock(tmp_path / "run")
  first.acquire()
  try:
    with pytest.raises(RunDirLockedError) as refused:
      RunLock(tmp_path / "run").acquire()
    message = str(refused.value)
    assert message.startswith(f"{tmp_path / 'run'} is in use by another trainer (host "
                              f"{socket.gethostname()}, pid {os.getpid()}, started ")
    assert message.endswith("last heartbeat 0 s ago); wait for it, or use another --workdir")
    assert first.held()
  finally:
    assert first.release()
  assert not (tmp_path / "run" / LOCK).exists()


def test_a_refusal_is_one_line_and_exit_code_2(tmp_path, capsys):
  holder = write_lock(tmp_path)
  with pytest.raises(SystemExit) as exited:
    cli.run_main(lambda: RunLock(tmp_path).acquire())
  assert exited.value.code == cli.EXIT_USER_ERROR
  (line,) = capsys.readouterr().err.splitlines()
  assert line.startswith(f"error: {tmp_path} is in use by another trainer (host "
                         f"{holder['host']}, pid {holder['pid']}, started ")


def dead_pid() -> int:
  proc = subprocess.Popen(["true"])
  proc.wait()  # reaped: the pid runs no more
  return proc.pid


def test_a_lock_whose_pid_is_gone_is_taken_over_with_a_warning(tmp_path, caplog):
  old = write_lock(tmp_path, pid=dead_pid())
  lock = RunLock(tmp_path)
  with caplog.at_level("WARNING", logger="jaxencoder"):
    lock.acquire()
  try:
    (warning,) = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert f"pid {old['pid']}, started " in warning
    assert warning.endswith(f"pid {old['pid']} no longer runs on this host")
    assert lock.held()
  finally:
    lock.release()


def test_a_lock_of_another_host_goes_stale_only_after_the_timeout(tmp_path, caplog):
  write_lock(tmp_path, host="elsewhere", pid=1, heartbeat=time.time() - 100)
  with pytest.raises(RunDirLockedError, match=r"host elsewhere, pid 1, .*last heartbeat 100 s"):
    RunLock(tmp_path, timeout_s=120).acquire()
  lock = RunLock(tmp_path, timeout_s=60)
  with caplog.at_level("WARNING", logger="jaxencoder"):
    lock.acquire()
  try:
    assert lock.held()
    assert any("no heartbeat for 100 s (lock_timeout_s=60)" in r.getMessage()
               for r in caplog.records)
  finally:
    lock.release()


def test_the_heartbeat_refreshes_the_lock(tmp_path):
  lock = RunLock(tmp_path, heartbeat_s=0.05)
  lock.acquire()
  try:
    first = lock.holder().heartbeat
    time.sleep(0.5)
    assert lock.holder().heartbeat > first and lock.held()
  finally:
    lock.release()


def test_release_deletes_only_a_lock_still_held(tmp_path):
  lock = RunLock(tmp_path)
  lock.acquire()
  theirs = write_lock(tmp_path, host="elsewhere")  # e.g. taken over while we hung
  assert not lock.release()
  assert json.loads((tmp_path / LOCK).read_text()) == theirs


def test_every_process_of_a_job_fails_as_its_leader(tmp_path):
  """Process 0 takes the lock; the others take none and raise the refusal it shares."""
  refusal = "WORKDIR is in use by another trainer (...)"
  with pytest.raises(RunDirLockedError, match=r"^WORKDIR is in use"):
    with run_lock.hold(tmp_path, leader=False, share=lambda mine: refusal):
      pass
  with run_lock.hold(tmp_path, leader=False, share=lambda mine: None):
    assert not (tmp_path / LOCK).exists()  # only the leader writes it
  shared = []
  write_lock(tmp_path)
  with pytest.raises(RunDirLockedError):
    with run_lock.hold(tmp_path, share=lambda mine: shared.append(mine) or mine):
      pass
  assert len(shared) == 1 and "is in use by another trainer" in shared[0]


def test_a_heartbeat_from_the_future_names_the_skew_and_how_to_take_over(tmp_path, capsys):
  """A holder whose clock is a day ahead: not "0 s ago; wait for it" for a day, and not
  taken over either (it may run): the refusal names the skew and the lock file to delete."""
  holder = write_lock(tmp_path, host="elsewhere", pid=4242, heartbeat=time.time() + 86400)
  with pytest.raises(SystemExit) as exited:
    cli.run_main(lambda: RunLock(tmp_path, timeout_s=1).acquire())
  assert exited.value.code == cli.EXIT_USER_ERROR
  (line,) = capsys.readouterr().err.splitlines()
  match = re.fullmatch(
      rf"error: {tmp_path} is locked by host elsewhere, pid 4242, whose last heartbeat is "
      r"(\d+) s ahead of this host's clock: the clocks disagree, so the lock does not go "
      r"stale \(lock_timeout_s\) until this one catches up; if no trainer runs as pid 4242 on "
      rf"elsewhere, delete {tmp_path / LOCK} and rerun, else wait for it or use another "
      r"--workdir", line)
  assert match and 86390 <= int(match[1]) <= 86400, line
  assert json.loads((tmp_path / LOCK).read_text()) == holder  # still theirs
  (tmp_path / LOCK).unlink()  # the take-over the line names
  lock = RunLock(tmp_path)
  lock.acquire()
  assert lock.release()


def test_a_heartbeat_a_little_ahead_is_an_ordinary_holder(tmp_path):
  write_lock(tmp_path, host="elsewhere", pid=1, heartbeat=time.time() + run_lock.SKEW_S / 2)
  with pytest.raises(RunDirLockedError, match=r"in use by another trainer \(host elsewhere, "
                     r"pid 1, .*last heartbeat 0 s ago\); wait for it"):
    RunLock(tmp_path).acquire()


def test_a_gcs_lock_is_exclusive_and_released(gcs):
  url = gcs.url("locked/run")
  first = RunLock(url)
  first.acquire()
  assert gcs.objects("locked/") == ["locked/run/lock.json"]
  with pytest.raises(RunDirLockedError, match=rf"^{url} is in use by another trainer"):
    RunLock(url).acquire()
  assert first.release() and gcs.objects("locked/") == []


# End to end.

def corpus(root: pathlib.Path):
  return root, th.text_corpus(root), th.write_vocab(root)


def train_py_command(corpus, workdir, *extra) -> list[str]:
  root, source, vocab = corpus
  overrides = {"data.source": source, "data.data_dir": root, "data.tokenizer": vocab,
               "data.seq_len": 16, "data.holdout_every": 10, "model.num_layers": 1,
               "model.emb_dim": 32, "model.num_heads": 4, "model.mlp_dim": 64,
               "model.max_len": 32, "model.vocab_size": len(th.VOCAB), "num_train_steps": 6,
               "batch_size": 8, "eval_batch_size": 8, "log_every": 1, "eval_every": 3,
               "checkpoint_every": 2, "optim.warmup_steps": 1, "progress_bar": "false"}
  return ([sys.executable, str(REPO / "train.py"), "--config", str(REPO / "configs/mlm_tiny.py"),
           "--workdir", str(workdir)] + [f"--config.{k}={v}" for k, v in overrides.items()]
          + list(extra))


@pytest.mark.slow
def test_a_second_train_py_on_a_workdir_exits_2_and_the_first_loses_nothing(tmp_path):
  data = corpus(tmp_path)
  workdir = tmp_path / "run"
  first = subprocess.Popen(train_py_command(data, workdir), stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.time() + 120
    while not (workdir / LOCK).exists():
      assert first.poll() is None and time.time() < deadline, first.stderr.read()[-3000:]
      time.sleep(0.05)
    first.send_signal(signal.SIGSTOP)  # holds the lock, however fast it would train
    try:
      second = subprocess.run(train_py_command(data, workdir, "--config.seed=1",
                                               "--config.optim.learning_rate=0.01"),
                              capture_output=True, text=True, timeout=300)
    finally:
      first.send_signal(signal.SIGCONT)
    err = first.communicate(timeout=300)[1]
  finally:
    if first.poll() is None:
      first.kill()
  assert second.returncode == 2, second.stderr[-3000:]
  (line,) = [l for l in second.stderr.splitlines() if l.startswith("error:")]
  assert line.startswith(f"error: {workdir} is in use by another trainer (host "
                         f"{socket.gethostname()}, pid {first.pid}, started ")
  assert line.endswith("wait for it, or use another --workdir")
  assert first.returncode == 0, err[-3000:]
  run = RunDir.open(workdir)
  assert run.steps() == [2, 4, 6] and run.read_config()["seed"] == 0
  rows = [(r["step"], r["split"]) for r in read_metrics(workdir) if r["split"] != "startup"]
  assert sorted(rows) == sorted(set(rows))  # each row once
  assert [s for s, split in rows if split == "train"] == list(range(1, 7))
  assert not (workdir / LOCK).exists()


def tree_snapshot(root: pathlib.Path) -> dict[str, str]:
  """Every path under `root` with its file's digest: what any write would change."""
  return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
          if p.is_file() else "dir" for p in sorted(root.rglob("*"))}


def set_writable(root: pathlib.Path, writable: bool) -> None:
  for p in [root, *root.rglob("*")]:
    mode = p.stat().st_mode
    p.chmod(mode | 0o200 if writable else mode & ~0o222)


TRAIN_4_STEPS = """
import sys
sys.path.insert(0, {tests!r})
import pathlib, train_helpers as th
from jaxencoder.train import loop
root = pathlib.Path({root!r})
config = th.tiny_config(root, {source!r}, root / "vocab.txt")
config.num_train_steps, config.checkpoint_every, config.eval_every = 4, 2, 4
loop.train_and_evaluate(config, {workdir!r})
"""


@pytest.mark.slow
def test_eval_only_and_predict_read_a_read_only_run_past_its_damaged_newest_step(
    tmp_path, caplog):
  """Step 4 damaged, the run read-only: both report step 2's model and write nothing."""
  from jaxencoder.train import loop, predict
  from test_faults import DAMAGE
  root, source, vocab = corpus(tmp_path)
  workdir = tmp_path / "run"
  code = TRAIN_4_STEPS.format(tests=str(REPO / "tests"), root=str(root), source=source,
                              workdir=str(workdir))  # elsewhere: tensorstore caches writes
  trained = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=600)
  assert trained.returncode == 0, trained.stderr[-3000:]
  step_2_only = tmp_path / "step_2_only"
  shutil.copytree(workdir, step_2_only)
  shutil.rmtree(step_2_only / "checkpoints" / "4")
  expected_eval = loop.evaluate_run(None, step_2_only)
  lines = ["the cat sat", "a dog"]
  expected_vectors = predict.predict(predict.load(step_2_only), lines)

  DAMAGE["truncated array file"](workdir / "checkpoints" / "4")
  before = tree_snapshot(workdir)
  set_writable(workdir, False)
  try:
    with caplog.at_level("WARNING", logger="jaxencoder"):
      assert loop.evaluate_run(None, workdir) == pytest.approx(expected_eval)
      vectors = predict.predict(predict.load(workdir), lines)
    with pytest.raises(ValueError, match=r"^no restorable checkpoint in .*: step 4: .*; pass "
                       r"another --step \(saved: 2, 4\), or none for the newest that restores$"):
      predict.load(workdir, step=4)  # the step asked for, or an error: no silent fallback
  finally:
    set_writable(workdir, True)
  np.testing.assert_allclose(vectors, expected_vectors, rtol=1e-6)
  skipped = [r.getMessage() for r in caplog.records if "cannot be restored" in r.getMessage()]
  assert len(skipped) == 2 and skipped[0].startswith("checkpoint step 4 in")  # evaluate_run
  assert skipped[1].startswith(f"{workdir / 'checkpoints' / '4'} cannot be restored (")
  assert skipped[1].endswith("); using step 2")  # predict: as every reader of a run says it
  assert tree_snapshot(workdir) == before  # no rename of step 4, no metrics, no TensorBoard
