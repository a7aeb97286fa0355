"""A run's two ends outside the train loop: a rerun of a finished run (its last step
trained, or stopped early) says so and returns the metrics it recorded, with nothing
compiled or evaluated again; a run that fails before its first checkpoint removes the run
directory it created (only the files a run writes: anything else stays, with its folder)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import ml_collections
from etils import epath

from jaxencoder.io import run_dir as run_dir_lib
from jaxencoder.io import run_lock, run_record
from jaxencoder.io.run_dir import RunDir
from jaxencoder.tasks.registry import owner
from jaxencoder.train.early_stopping import Patience, replayed

log = logging.getLogger(__name__)

# What a run writes in its directory (run_dir.py, run_record.py, run_lock.py, metrics.py).
RUN_FILES = (run_dir_lib.CHECKPOINTS, run_dir_lib.METRICS, f"{run_dir_lib.METRICS}.damaged",
             run_dir_lib.BEST, run_dir_lib.TENSORBOARD, run_record.RECORD, run_lock.LOCK,
             *run_record.TOKENIZER_NAMES)


def done_line(config: ml_collections.ConfigDict, run_dir: RunDir) -> str | None:
  """"done at step N ..." when `run_dir`'s newest step ends the run `config` trains
  (num_train_steps reached, or early_stopping_patience spent); None otherwise."""
  step = run_dir.latest_step()
  if step is None:
    return None
  where = f"{run_dir.path} is done at step {step}"
  if step >= config.num_train_steps:
    return (f"{where} of {config.num_train_steps}: nothing trained or evaluated again "
            "(a larger num_train_steps trains on)")
  stopped = _patience(config, run_dir, step)
  if stopped.exhausted:
    return f"{where} of {config.num_train_steps}, stopped early: {stopped.reason()}"
  return None


def _patience(config: ml_collections.ConfigDict, run_dir: RunDir, step: int) -> Patience:
  """The early-stopping count at `step`, replayed from the run's eval rows."""
  metric = config.best_metric
  mode = owner(config)[1].metric_mode(metric)
  patience = Patience(metric, mode, config.early_stopping_patience)
  return replayed(run_dir.read_metrics(), patience, step)


def recorded_metrics(run_dir: RunDir, step: int) -> dict[str, float]:
  """What train_and_evaluate returned when the run finished: the eval row at `step` (at
  the best step with load_best_at_end: best.json's), and the `test` row as test_*."""
  rows = run_dir.read_metrics()
  best = run_dir.best_at_end()
  at = best["step"] if best and best.get("step") is not None else step
  metrics = _values(rows, "eval", at)
  for row in rows:
    if row.get("split") == "test":
      metrics.update({f"test_{k}": v for k, v in _values([row], "test", row["step"]).items()})
  return metrics


def _values(rows: list[dict[str, Any]], split: str, step: int) -> dict[str, float]:
  matches = [r for r in rows if r.get("split") == split and r.get("step") == step]
  row = matches[-1] if matches else {}
  return {k: v for k, v in row.items() if k not in ("split", "step", "time")}


@contextlib.contextmanager
def removed_if_unfinished(workdir, *, enabled: bool = True) -> Iterator[None]:
  """Should the block fail while no checkpoint is saved in `workdir`, and `workdir` did
  not exist before it, removes the files a run writes there (RUN_FILES), then the folder
  if that left it empty: a failed first try leaves no run directory behind."""
  path = epath.Path(workdir)
  made = enabled and not path.exists()
  try:
    yield
  except BaseException:
    if made and path.exists() and RunDir(path).latest_step() is None:
      _remove_run_files(path)
    raise


def _remove_run_files(path: epath.Path) -> None:
  for name in RUN_FILES:
    target = path / name
    with contextlib.suppress(OSError):
      if target.is_dir():
        target.rmtree()
      elif target.exists():
        target.unlink()
  with contextlib.suppress(OSError):
    if not any(path.iterdir()):
      path.rmdir()
      log.info("removed %s: the run failed before its first checkpoint", path)
