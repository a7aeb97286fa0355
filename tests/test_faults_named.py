"""Faults named in one line: a full disk, a damaged metrics.jsonl, bad config / workdir /
safetensors files, a diverging loss and signals each end in one line that names the file,
the step and what to do, never a traceback (JAXENCODER_TRACEBACK=1 shows one)."""

import errno
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
import types

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from orbax.checkpoint._src.path import async_path

from jaxencoder import cli
from jaxencoder.errors import is_out_of_space
from jaxencoder.io.checkpoint import Checkpointer, OutOfSpace
from jaxencoder.train import config_file, loop, preflight, stop

REPO = pathlib.Path(__file__).resolve().parents[1]


# A full disk during a save.

def state(step: int) -> dict:
  return {"step": jnp.array(step), "w": jnp.arange(64.0).reshape(8, 8) * step}


def no_space(*args, **kwargs):
  raise OSError(errno.ENOSPC, "No space left on device")


async def no_space_async(*args, **kwargs):
  no_space()


# orbax's leftover writes of a failed save call into its closed event loop (unraisable).
orbax_leftovers = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


@pytest.fixture
def checkpointer(tmp_path):
  with Checkpointer(tmp_path / "ckpt", save_interval_steps=1, max_to_keep=None) as ckpt:
    assert ckpt.save(1, state(1))
    ckpt.wait()
    yield ckpt


@orbax_leftovers
def test_a_full_disk_in_the_background_save_names_the_step_and_the_durable_one(
    checkpointer, monkeypatch):
  monkeypatch.setattr(async_path, "write_text", no_space_async)  # orbax's commit marker
  assert checkpointer.save(2, state(2))  # started; it fails in the background thread
  with pytest.raises(OutOfSpace) as raised:
    checkpointer.wait()
  assert str(raised.value) == (f"out of space writing step 2 in {checkpointer.directory}; "
                               "step 1 is the last durable one")
  assert (raised.value.step, raised.value.durable) == (2, 1)
  assert checkpointer.all_steps() == [1]  # the partial step 2 is not listed as durable


@orbax_leftovers
def test_a_background_failure_surfaces_at_the_next_save_or_poll(checkpointer, monkeypatch):
  monkeypatch.setattr(async_path, "write_text", no_space_async)
  assert checkpointer.save(2, state(2))
  with pytest.raises(OutOfSpace, match="writing step 2 .* step 1 is the last durable"):
    for _ in range(1000):  # the loop polls once per step
      checkpointer.check()
      time.sleep(0.01)
  monkeypatch.undo()
  checkpointer.wait()  # raised once: closing afterwards does not raise again
  assert checkpointer.save(3, state(3))
  checkpointer.wait()
  assert checkpointer.all_steps() == [1, 3]


def test_a_disk_without_room_for_one_more_step_is_refused_before_writing(checkpointer,
                                                                           monkeypatch):
  usage = shutil.disk_usage(checkpointer.directory)
  monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=4096))
  with pytest.raises(OutOfSpace, match="writing step 2 .* step 1 is the last durable one"):
    checkpointer.save(2, state(2))
  assert sorted(p.name for p in checkpointer.directory.iterdir()) == ["1"]


@orbax_leftovers
def test_the_first_save_failing_says_no_step_is_durable(tmp_path, monkeypatch):
  monkeypatch.setattr(async_path, "write_text", no_space_async)
  with Checkpointer(tmp_path / "ckpt", save_interval_steps=1, max_to_keep=None) as ckpt:
    ckpt.save(5, state(5))
    with pytest.raises(OutOfSpace, match="writing step 5 .*; no step is durable yet$"):
      ckpt.wait()


@orbax_leftovers
def test_other_save_errors_are_not_reported_as_a_full_disk(checkpointer, monkeypatch):
  async def denied(*args, **kwargs):
    raise PermissionError(errno.EACCES, "Permission denied")
  monkeypatch.setattr(async_path, "write_text", denied)
  checkpointer.save(2, state(2))
  with pytest.raises(PermissionError):
    checkpointer.wait()


def test_full_disk_errors_are_recognised_by_errno_text_and_cause():
  tensorstore = ValueError('RESOURCE_EXHAUSTED: Error writing "w/0.0" in OCDBT database at '
                           'local file "/r/ckpt/2": No space left on device [OS error]')
  assert is_out_of_space(tensorstore)
  assert is_out_of_space(OSError(errno.ENOSPC, "x"))
  wrapped = RuntimeError("commit failed")
  wrapped.__cause__ = OSError(errno.ENOSPC, "x")
  assert is_out_of_space(wrapped)
  assert not is_out_of_space(ValueError("RESOURCE_EXHAUSTED: Out of memory allocating 8 GiB"))
  assert not is_out_of_space(ValueError(  # XLA:TPU's words: a memory space, not a disk
      "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
      "space hbm. Used 18.2G of 15.48G hbm. Exceeded hbm capacity by 2.7G."))
  assert not is_out_of_space(OSError(errno.EACCES, "Permission denied"))


def test_train_py_reports_the_checkpoint_not_a_later_metrics_flush():
  full = OutOfSpace(15, "/r/checkpoints", 10)
  try:
    try:
      raise full
    finally:
      raise OSError(errno.ENOSPC, "No space left on device")  # the TensorBoard writer's close
  except OSError as e:
    assert stop.full_disk(e) == str(full)
  assert stop.full_disk(OSError(errno.ENOSPC, "No space left on device", "/r/m")) == (
      "out of space: [Errno 28] No space left on device: '/r/m'")
  assert stop.full_disk(OSError(errno.EACCES, "Permission denied")) is None


def test_orbax_tracebacks_of_a_full_disk_are_not_logged():
  def record(error):
    return logging.LogRecord("absl", logging.ERROR, __file__, 1, "save failed", (),
                             (type(error), error, None))
  assert not cli._not_out_of_space(record(OSError(errno.ENOSPC, "No space left")))
  assert cli._not_out_of_space(record(OSError(errno.EACCES, "Permission denied")))


# One line for each user error.

def write(path: pathlib.Path, text: str) -> pathlib.Path:
  path.write_text(text)
  return path


def test_a_config_file_with_a_syntax_error_names_file_line_and_error(tmp_path):
  config = write(tmp_path / "bad.py", "def get_config():\n  return dict(\n")
  with pytest.raises(cli.UserError) as raised:
    config_file.load_config(str(config))
  assert str(raised.value) == f"--config {config}:2: '(' was never closed"


def test_a_config_file_that_fails_when_run_names_its_line(tmp_path):
  config = write(tmp_path / "typo.py", "X = 1\n\ndef get_config():\n  return steps * X\n")
  with pytest.raises(cli.UserError) as raised:
    config_file.load_config(str(config))
  assert str(raised.value) == (f"--config {config}:4: NameError: name 'steps' is not "
                               "defined")


def test_a_workdir_that_is_a_file_is_refused(tmp_path):
  workdir = write(tmp_path / "run", "")
  with pytest.raises(cli.UserError) as raised:
    preflight.check_writable_workdir(str(workdir))
  assert str(raised.value) == (f"--workdir {workdir}: is a file, not a directory; pass a "
                               "directory (a new one is created)")
  with pytest.raises(cli.UserError, match=f"{workdir} is a file, not a directory$"):
    preflight.check_writable_workdir(str(workdir / "sub"))


def test_a_workdir_that_cannot_be_written_is_refused_by_name(tmp_path, monkeypatch):
  def read_only(*args, **kwargs):
    raise OSError(errno.EROFS, "Read-only file system")
  monkeypatch.setattr(preflight.tempfile, "TemporaryFile", read_only)
  with pytest.raises(cli.UserError) as raised:
    preflight.check_writable_workdir(str(tmp_path))
  assert str(raised.value) == (f"--workdir {tmp_path}: {tmp_path} is not writable (Read-only "
                               "file system); pass a writable directory or fix its permissions")


def test_a_new_workdir_is_created_and_passes(tmp_path):
  preflight.check_writable_workdir(str(tmp_path / "a" / "b"))
  assert (tmp_path / "a" / "b").is_dir() and not any((tmp_path / "a" / "b").iterdir())


def test_folders_a_failed_command_made_are_removed_only_while_empty(tmp_path):
  from jaxencoder.io import paths
  (tmp_path / "kept").mkdir()
  new = tmp_path / "kept" / "a" / "b"
  with pytest.raises(RuntimeError), paths.removed_if_left_empty(new):
    new.mkdir(parents=True)
    raise RuntimeError("refused")
  assert list(tmp_path.rglob("*")) == [tmp_path / "kept"]  # made: gone; there before: kept
  written = tmp_path / "x" / "y"
  with pytest.raises(RuntimeError), paths.removed_if_left_empty(written):
    written.mkdir(parents=True)
    (written / "lock.json").write_text("{}")
    raise RuntimeError("failed after writing")
  assert (written / "lock.json").is_file()  # holds something: stays, with its parents
  with paths.removed_if_left_empty(tmp_path / "ok"):
    (tmp_path / "ok").mkdir()
  assert (tmp_path / "ok").is_dir()  # no failure: nothing removed


def test_a_file_named_checkpoints_in_the_workdir_is_refused(tmp_path):
  write(tmp_path / "checkpoints", "")
  with pytest.raises(cli.UserError, match=f"{tmp_path / 'checkpoints'} is a file, not a dir"):
    preflight.check_writable_workdir(str(tmp_path))


def test_a_truncated_safetensors_file_is_named(tmp_path):
  from safetensors.numpy import save_file
  from jaxencoder.pretrained import hf_checkpoint
  weights = tmp_path / hf_checkpoint.WEIGHTS
  save_file({"w": np.zeros((64, 64), np.float32)}, str(weights))
  weights.write_bytes(weights.read_bytes()[:5000])
  with pytest.raises(ValueError) as raised:
    hf_checkpoint.read_tensors(tmp_path)
  assert str(raised.value).startswith(f"{weights}: truncated or damaged safetensors file (")
  assert str(raised.value).endswith("); download or convert it again")


def test_a_diverged_loss_names_the_step_the_durable_step_and_the_fix(checkpointer):
  config = ml_collections.ConfigDict({"optim": {"learning_rate": 3.0, "grad_clip_norm": 0.0}})
  run = types.SimpleNamespace(checkpointer=checkpointer, config=config)
  error = loop._diverged(run, loop.NonFiniteLossError("loss or gradient became NaN/Inf at "
                                                      "step 3; stopped without saving that state"))
  assert str(error) == (
      "loss or gradient became NaN/Inf at step 3; stopped without saving that state; step 1 in "
      f"{checkpointer.directory} is the last durable one; lower optim.learning_rate (now 3.0) "
      "or optim.grad_clip_norm (now 0.0) and rerun with the same --workdir")


# train.py end to end: exit code and the one line.

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  import train_helpers as th
  return th.corpus_overrides(tmp_path_factory.mktemp("data"))


TINY = {"data.seq_len": 16, "model.num_layers": 1, "model.emb_dim": 32, "model.num_heads": 4,
        "model.mlp_dim": 64, "model.max_len": 32, "batch_size": 8, "eval_batch_size": 8,
        "progress_bar": "false", "num_train_steps": 40, "log_every": 5, "eval_every": 100,
        "checkpoint_every": 5}


def train_py(workdir, config=REPO / "configs/mlm_tiny.py", prefix=(), **overrides):
  flags = [f"--config.{k}={v}" for k, v in overrides.items()]
  command = [*prefix, sys.executable, str(REPO / "train.py"), "--config", str(config),
             "--workdir", str(workdir), *flags]
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("JAXENCODER_TRACEBACK", None)
  env.pop("XLA_FLAGS", None)  # one device: checkpoints of a steady size (the full-disk case)
  return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def one_error_line(result, code: int) -> str:
  assert result.returncode == code, result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  return [line for line in result.stderr.splitlines() if "INFO" not in line][-1]


@pytest.mark.slow
def test_train_py_config_syntax_error_is_one_line(tmp_path):
  config = write(tmp_path / "bad.py", "def get_config():\n  return dict(\n")
  line = one_error_line(train_py(tmp_path / "run", config), 2)
  assert line == f"error: --config {config}:2: '(' was never closed"


@pytest.mark.slow
def test_train_py_workdir_that_is_a_file_is_one_line(tmp_path):
  workdir = write(tmp_path / "run", "")
  line = one_error_line(train_py(workdir), 2)
  assert line == f"error: --workdir {workdir}: is a file, not a directory; pass a directory " \
                 "(a new one is created)"


def read_only_prefix(folder: pathlib.Path) -> tuple[str, ...]:
  """A command prefix under which `folder` is read-only: a read-only bind mount in a
  private mount namespace for root (whom permissions do not stop), else chmod."""
  if os.geteuid() != 0:
    folder.chmod(0o555)
    return ()
  bind = (f"mount --bind {folder} {folder} && mount -o remount,ro,bind {folder} && "
          'exec "$@"')
  return ("unshare", "-m", "sh", "-c", bind, "sh")


@pytest.mark.slow
def test_train_py_read_only_workdir_is_one_line_before_compiling(tmp_path, corpus):
  workdir = tmp_path / "run"
  workdir.mkdir()
  result = train_py(workdir, prefix=read_only_prefix(workdir), **corpus, **TINY)
  line = one_error_line(result, 2)
  assert line.startswith(f"error: --workdir {workdir}: {workdir} is not writable (")
  assert line.endswith("); pass a writable directory or fix its permissions")
  assert "compiled" not in result.stderr  # refused before anything was built


@pytest.mark.slow
def test_train_py_diverging_loss_is_one_line_naming_the_durable_step(tmp_path, corpus):
  from jaxencoder.io.run_dir import RunDir
  result = train_py(tmp_path / "run", **corpus, **{
      **TINY, "optim.learning_rate": 1e3, "optim.warmup_steps": 50, "optim.grad_clip_norm": 0})
  line = one_error_line(result, 1)
  durable = RunDir.open(tmp_path / "run").latest_step()
  match = re.fullmatch(r"error: loss or gradient became NaN/Inf at step (\d+); stopped without "
                       r"saving that state; step (\d+) in (\S+) is the last durable one; lower "
                       r"optim.learning_rate \(now 1000.0\) or optim.grad_clip_norm \(now 0.0\) "
                       r"and rerun with the same --workdir", line)
  assert match, line
  assert int(match[2]) == durable < int(match[1]) and match[3] == str(tmp_path / "run/checkpoints")


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="a tiny tmpfs needs root (a private mount namespace)")
@pytest.mark.parametrize("size,durable", [("200k", False), ("1200k", True)])  # first, later save
def test_train_py_full_disk_is_one_line_and_exit_75(tmp_path, corpus, size, durable):
  disk = tmp_path / "disk"
  disk.mkdir()
  mount = (f'mount -t tmpfs -o size={size} tmpfs {disk} && "$@"; code=$?; '
           f'ls {disk}/run/checkpoints 2>/dev/null || echo no run dir; exit $code')  # what is left
  result = train_py(disk / "run", prefix=("unshare", "-m", "sh", "-c", mount, "sh"),
                    **corpus, **{**TINY, "num_train_steps": 200})
  line = one_error_line(result, 75)
  match = re.fullmatch(rf"out of space writing step (\d+) in {disk}/run/checkpoints; "
                       r"(no step is durable yet|step (\d+) is the last durable one)", line)
  assert match and bool(match[3]) == durable, line
  steps = sorted(int(name) for name in result.stdout.split() if name.isdigit())
  assert steps[-1:] == ([int(match[3])] if match[3] else [])  # the durable step is listed
  # Failed before its first checkpoint: the run directory it made is gone (space freed).
  assert ("no run dir" in result.stdout) == (not durable)
  # No traceback: the run's own INFO lines (a step and a save every 5 steps) grow with how
  # many saves fit before the disk fills, which depends on when old ones are deleted.
  noise = [l for l in result.stderr.splitlines() if " INFO " not in l]
  assert int(match[1]) not in steps and len(noise) < 15, result.stderr
