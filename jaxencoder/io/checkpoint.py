"""Checkpoints of a training run: train state, data-iterator state and config.

A thin layer over `orbax.checkpoint.CheckpointManager`. On-disk layout, one
directory per saved step (all written by orbax, no pickle anywhere):

  DIR/
    <step>/
      state/    # the train-state pytree: tensorstore/OCDBT arrays + _METADATA;
                #   restorable onto any mesh or device count
      data/     # JSON: the grain iterator's `get_state()` dict (if given)
      config/   # JSON: the run's config, converted to plain JSON (if given)
      metrics/  # JSON: the metrics passed to `save` (only with `best_metric`)
      _CHECKPOINT_METADATA

Retention keeps the latest `max_to_keep` steps, the best `keep_best` by `best_metric`
and every step that is a multiple of `keep_every` (if > 0); orbax deletes the rest after
each save.
"""

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as policies

from jaxencoder.errors import NotDamaged, first_line, is_out_of_space
from jaxencoder.io.paths import as_path

PyTree = Any
log = logging.getLogger("jaxencoder")
STATE, DATA, CONFIG = "state", "data", "config"


class Checkpointer:
  """Saves and restores (state, data-iterator state, config) per training step.

  Saves happen when `step % save_interval_steps == 0` (or `force=True`).
  Retention: the latest `max_to_keep` (None: all), plus the best `keep_best` by
  `metrics[best_metric]` ("min" or "max") among steps saved with metrics, plus every
  step that is a multiple of `keep_every` (0: none; for studies across training).
  """
  _pending: int | None = None  # the step an async save is writing

  def __init__(self, directory: epath.PathLike, *, save_interval_steps: int,
               max_to_keep: int | None, best_metric: str | None = None,
               best_mode: str = "min", keep_best: int = 1, keep_every: int = 0,
               async_save: bool = True, read_only: bool = False):
    """`read_only`: restores only, writes nothing (eval-only, predict; a read-only run)."""
    if best_mode not in ("min", "max"):
      raise ValueError(f"best_mode must be 'min' or 'max', got {best_mode!r}")
    self.directory = as_path(directory)  # orbax needs absolute paths; URLs stay URLs
    self.best_metric = best_metric
    self.read_only = read_only
    self._interval = save_interval_steps
    options = ocp.CheckpointManagerOptions(
        **(READ_ONLY if read_only else {}),
        save_decision_policy=policies.AnySavePolicy([
            policies.FixedIntervalPolicy(save_interval_steps),
            policies.PreemptionCheckpointingPolicy()]),
        preservation_policy=_retention(max_to_keep, best_metric, best_mode, keep_best,
                                       keep_every),
        best_fn=_metric_getter(best_metric) if best_metric else None,
        best_mode=best_mode,
        enable_async_checkpointing=async_save)
    if read_only:
      _quiet_read_only_notice()
    self._manager = ocp.CheckpointManager(
        self.directory, options=options, item_handlers={
            STATE: ocp.StandardCheckpointHandler(),
            DATA: ocp.JsonCheckpointHandler(),
            CONFIG: ocp.JsonCheckpointHandler()})

  def save(self, step: int, state: PyTree, *, data_state: Mapping | None = None,
           config: Any = None, metrics: Mapping[str, Any] | None = None,
           force: bool = False) -> bool:
    """Starts saving `step` (async by default); False if the interval says skip.

    `metrics` (e.g. eval loss) rank checkpoints for `best_metric` retention.
    `force` saves off-interval, e.g. the final step; an existing step is skipped.
    """
    if force and step in self._manager.all_steps():
      return False
    items = {STATE: ocp.args.StandardSave(state)}
    if data_state is not None:
      items[DATA] = ocp.args.JsonSave(data_state)
    if config is not None:
      items[CONFIG] = ocp.args.JsonSave(to_json(config))
    metrics = self._checked_metrics(metrics)
    if not force and step % self._interval:  # no policy query: with several processes
      return False  # the preemption policy's sync point is a collective
    self.wait()  # orbax waits for the previous save anyway; its failure is named here
    self._check_room(step)
    with self._writing(step):
      started = self._manager.save(step, args=ocp.args.Composite(**items), metrics=metrics,
                                   force=force)
    self._pending = step if started else None
    return started

  def _checked_metrics(self, metrics: Mapping[str, Any] | None) -> dict | None:
    if metrics is None:
      return None
    if self.best_metric and self.best_metric not in metrics:
      raise ValueError(f"metrics lack best_metric {self.best_metric!r}: "
                       f"{sorted(metrics)}")
    return to_json(metrics)

  def restore(self, step: int | None = None, *, abstract_state: PyTree,
              with_data: bool = True) -> tuple[PyTree, dict | None, dict | None]:
    """(state, data_state, config) of `step` (default: latest).

    `abstract_state` is a pytree of `jax.ShapeDtypeStruct` with `sharding=` set;
    arrays come back with those shardings, whatever mesh they were saved from.
    `data_state` / `config` are None when not saved (or `with_data=False`).
    """
    step = self._existing_step(step)
    saved = self._manager.metadata(step).item_handlers or {}
    items = {STATE: ocp.args.StandardRestore(abstract_state)}
    if with_data and DATA in saved:
      items[DATA] = ocp.args.JsonRestore()
    if CONFIG in saved:
      items[CONFIG] = ocp.args.JsonRestore()
    restored = self._manager.restore(step, args=ocp.args.Composite(**items))
    return restored[STATE], restored.get(DATA), restored.get(CONFIG)

  def restore_newest(self, *, abstract_state: PyTree, with_data: bool = True
                     ) -> tuple[int, PyTree, dict | None, dict | None]:
    """(step, state, data_state, config) of the newest step that restores.

    A damaged step (truncated or missing files, an empty step directory) gets one
    warning naming it and why, and the next older step is tried; once one restores,
    the damaged newer ones are renamed `<step>.unrestorable` so their step numbers can
    be saved again. If none restores, nothing is renamed and the error lists each step.
    """
    failures = []
    for step in reversed(self.all_steps()):
      try:
        restored = self.restore(step, abstract_state=abstract_state, with_data=with_data)
      except Exception as e:  # orbax / tensorstore raise many types for damaged files
        failures.append((step, first_line(e)))
        log.warning("checkpoint step %d in %s cannot be restored (%s); trying an older step",
                    step, self.directory, failures[-1][1])
        continue
      for bad, _ in failures:
        self._set_aside(bad)
      return (step, *restored)
    raise CheckpointError(f"no restorable checkpoint in {self.directory}: " +
                          "; ".join(f"step {s}: {why}" for s, why in failures))

  def _set_aside(self, step: int) -> None:
    """Renames a damaged step directory out of orbax's way (kept for inspection); a
    read-only Checkpointer leaves it, skipping it again next time."""
    if self.read_only:
      return
    path = self.directory / str(step)
    if path.exists():
      path.rename(self.directory / f"{step}.unrestorable")
    self._manager.reload()

  def _existing_step(self, step: int | None) -> int:
    steps = self.all_steps()
    if not steps:
      raise FileNotFoundError(f"no checkpoint in {self.directory}")
    if step is None:
      return max(steps)
    if step not in steps:
      raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; "
                              f"steps: {steps}")
    return step

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def best_step(self) -> int | None:
    """Step with the best `best_metric`; None without `best_metric` or metrics."""
    return self._manager.best_step() if self.best_metric else None

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def wait(self) -> None:
    """Blocks until pending async saves (and old-step deletions) are done; OutOfSpace if
    the disk filled up."""
    pending, self._pending = self._pending, None
    with self._writing(pending):
      self._manager.wait_until_finished()

  def check(self) -> None:
    """Raises OutOfSpace at once if a background save already failed for lack of space
    (single process: a poll between steps, no waiting)."""
    if self._pending is not None and not self._manager.is_saving_in_progress():
      self.wait()

  def _check_room(self, step: int) -> None:
    """OutOfSpace before writing `step` if the disk has less room than the newest step
    takes (local disks; a run's steps are about the same size), not halfway through."""
    newest = self._manager.latest_step()
    if newest is None or "://" in str(self.directory):
      return
    if shutil.disk_usage(self.directory).free < _disk_bytes(self.directory / str(newest)):
      raise OutOfSpace(step, self.directory, newest)

  @contextlib.contextmanager
  def _writing(self, step: int | None):
    """Turns a full disk while writing `step` into OutOfSpace naming the durable step."""
    try:
      yield
    except Exception as e:
      if step is None or not is_out_of_space(e):
        raise
      self._manager.reload()  # the failed step is not listed; its temporary dir never counts
      raise OutOfSpace(step, self.directory, self._manager.latest_step()) from None

  def close(self) -> None:
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


class CheckpointError(RuntimeError):
  """No checkpoint of a run directory can be restored."""


class ParamsMismatch(NotDamaged):
  """Saved params that do not fit the target asked for (a shape, a missing subtree): the
  caller's error, not a damaged checkpoint, so no older step is tried instead."""


class OutOfSpace(OSError):
  """The disk filled up while saving `step`; `durable` is the newest complete step (None:
  none). Rerunning once there is space resumes from it (train.py exits 75)."""

  def __init__(self, step: int, directory, durable: int | None):
    self.step, self.directory, self.durable = step, directory, durable
    last = (f"step {durable} is the last durable one" if durable is not None
            else "no step is durable yet")
    super().__init__(errno.ENOSPC, f"out of space writing step {step} in {directory}; {last}")

  def __str__(self) -> str:
    return self.strerror


def _disk_bytes(directory) -> int:
  """The bytes the files under a local `directory` occupy on disk."""
  return sum(os.stat(os.path.join(root, name)).st_blocks * 512
             for root, _, names in os.walk(directory) for name in names)


def _metric_getter(name: str):
  return lambda metrics: float(metrics[name])


def _retention(max_to_keep: int, best_metric: str | None, best_mode: str,
               keep_best: int, keep_every: int = 0) -> policies.PreservationPolicy:
  """Latest `max_to_keep`, plus the best `keep_best` by `best_metric` if set, plus the
  multiples of `keep_every` if > 0 (orbax's EveryNSteps: what its deprecated
  `keep_period` option sets, which a preservation_policy overrides)."""
  if keep_every < 0:
    raise ValueError(f"keep_every must be >= 0 (0: off), got {keep_every}")
  kept = [policies.LatestN(n=max_to_keep)]
  if best_metric:  # BestN keeps the last n after sorting; reverse=True puts the minimum last
    kept.append(policies.BestN(get_metric_fn=_metric_getter(best_metric),
                               reverse=best_mode == "min", n=keep_best,
                               keep_checkpoints_without_metrics=False))
  if keep_every:
    kept.append(policies.EveryNSteps(interval_steps=keep_every))
  return kept[0] if len(kept) == 1 else policies.AnyPreservationPolicy(kept)


def to_json(value: Any) -> Any:
  """Plain-JSON copy of a config/metrics value: tuples -> lists, arrays -> lists,
  numpy/jax scalars -> Python numbers, ConfigDicts -> dicts, anything else -> str."""
  if hasattr(value, "to_dict"):  # ml_collections.ConfigDict / FrozenConfigDict
    value = value.to_dict()
  if isinstance(value, Mapping):
    return {str(k): to_json(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_json(v) for v in value]
  if value is None or isinstance(value, (bool, int, float, str)):
    return value
  if isinstance(value, (np.ndarray, np.generic, jax.Array)):
    return np.asarray(value).tolist()
  return str(value)


# What read_only implies, set here: orbax logs a warning for each option it has to change.
READ_ONLY = {"read_only": True, "save_interval_steps": 0, "create": False}


def reader(directory: epath.PathLike) -> ocp.CheckpointManager:
  """A CheckpointManager that reads only, quietly: a handler for every item a step may
  hold (orbax warns about each item it has none for, even one not asked for)."""
  _quiet_read_only_notice()
  return ocp.CheckpointManager(
      as_path(directory), options=ocp.CheckpointManagerOptions(**READ_ONLY),
      item_handlers={STATE: ocp.PyTreeCheckpointHandler(), DATA: ocp.JsonCheckpointHandler(),
                     CONFIG: ocp.JsonCheckpointHandler()})


def _quiet_read_only_notice() -> None:
  """orbax warns 'Given directory is read only' for every read-only manager, always:
  asked for, it is no news (its only warning no option avoids)."""
  absl = logging.getLogger("absl")
  if _not_read_only_notice not in absl.filters:
    absl.addFilter(_not_read_only_notice)


def _not_read_only_notice(record: logging.LogRecord) -> bool:
  return record.msg != "Given directory is read only=%s"


def restore_params_only(directory: epath.PathLike, abstract_params: PyTree, *,
                        subtree: Sequence[str], step: int | None = None) -> PyTree:
  """Loads only `state[subtree]` (e.g. ("params", "encoder")) of `step` (default: the
  latest) in `directory`.

  For `init_from`: e.g. a pretrained encoder into a model with a new head.
  `abstract_params` mirrors the subtree as `jax.ShapeDtypeStruct`s with
  shardings. Raises ValueError naming every path whose shape differs or which
  exists on one side only.
  """
  directory = as_path(directory)
  if not directory.exists():
    raise FileNotFoundError(f"no checkpoint directory {directory}")
  manager = reader(directory)
  try:
    step = manager.latest_step() if step is None else step
    if step is None:
      raise FileNotFoundError(f"no checkpoint in {directory}")
    saved_tree = manager.item_metadata(step)[STATE].tree
    target = _nest(subtree, abstract_params)
    _check_same_shapes(_nest(subtree, _get_subtree(saved_tree, subtree, directory)),
                       target)
    restored = manager.restore(step, args=ocp.args.Composite(**{
        STATE: ocp.args.PyTreeRestore(
            item=target, partial_restore=True,
            restore_args=ocp.checkpoint_utils.construct_restore_args(target))}))
  finally:
    manager.close()
  return _get_subtree(restored[STATE], subtree, directory)


def _get_subtree(tree: PyTree, subtree: Sequence[str], directory) -> PyTree:
  for key in subtree:
    if not isinstance(tree, Mapping) or key not in tree:
      raise ParamsMismatch(f"checkpoint state in {directory} has no subtree "
                           f"{'/'.join(subtree)}")
    tree = tree[key]
  return tree


def _nest(subtree: Sequence[str], leaf_tree: PyTree) -> PyTree:
  for key in reversed(subtree):
    leaf_tree = {key: leaf_tree}
  return leaf_tree


def _shapes_by_path(tree: PyTree) -> dict[str, tuple[int, ...]]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
          for path, leaf in leaves}


_MAX_LISTED = 8


def _check_same_shapes(saved: PyTree, wanted: PyTree) -> None:
  saved_shapes, wanted_shapes = _shapes_by_path(saved), _shapes_by_path(wanted)
  problems = [f"{p}: checkpoint {saved_shapes.get(p, 'missing')} vs "
              f"model {wanted_shapes.get(p, 'missing')}"
              for p in sorted(saved_shapes.keys() | wanted_shapes.keys())
              if saved_shapes.get(p) != wanted_shapes.get(p)]
  if problems:
    shown = problems[:_MAX_LISTED] + ([f"... and {len(problems) - _MAX_LISTED} more"]
                                      if len(problems) > _MAX_LISTED else [])
    raise ParamsMismatch(f"checkpoint params do not fit the model ({len(problems)} "
                         "params):\n  " + "\n  ".join(shown))
