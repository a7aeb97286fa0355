"""The run directory: the only code that knows its layout.

  WORKDIR/                     # local path or gs://bucket/path
    checkpoints/<step>/        # orbax, see jaxencoder.io.checkpoint:
      state/ data/ config/ metrics/
    metrics.jsonl              # one JSON object per line: {"step", "split", metric: value}
    metrics.jsonl.damaged      # lines a resume set aside (a crash cut them mid-write)
    tensorboard/               # TensorBoard events
    tokenizer.json, vocab.txt  # the tokenizer the run's inputs use (its own copy)
    run_record.json            # what its numbers mean: the tokenizer files' sha256, the
                               # label names, each split's fingerprint (io/run_record.py)
    best.json                  # load_best_at_end: {"step", "metric", "value"}, the step
                               # readers take when none is named (RunDir.default_step)

train.py writes it (`RunDir.checkpointer`, `metrics_file`, `tensorboard_dir`); the
converter creates one from a Hugging Face checkpoint (`write_params`); `init_from`,
probing and the converter back to Hugging Face read it (`read_config`, `restore_subtree`,
`read_metrics`). It stores and reads trees and dicts; it knows no model: the model side
(jaxencoder/model/restore_targets.py) builds the restore target, the EncoderConfig and the stack
layout. A path may name the workdir or its `checkpoints/` folder.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import orbax.checkpoint as ocp
from etils import epath

from jaxencoder.errors import NotDamaged, first_line
from jaxencoder.io.checkpoint import CONFIG, STATE, Checkpointer, reader, restore_params_only
from jaxencoder.io import run_record
from jaxencoder.io.paths import as_path

CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
BEST = "best.json"
TENSORBOARD = "tensorboard"
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
Params = Any
T = TypeVar("T")
log = logging.getLogger("jaxencoder")
# RunDir's model-side methods, now in jaxencoder.model.restore_targets: storage stores trees.
MOVED = {"model_config": "stored_config(run, step)",
         "restore_encoder": "restore_encoder(run, abstract, step=step)",
         "write_encoder": "write_encoder(run, cfg, params, tokenizer)"}


class UnrestorableStep(ValueError):
  """A checkpoint step whose files cannot be read (or no step that can); `reason`: why."""

  def __init__(self, message: str, reason: str):
    super().__init__(message)
    self.reason = reason


class RunDir:
  """A run directory (local or gs://). `RunDir(path)` for writing, `RunDir.open(path)`
  for reading an existing one (path = workdir or workdir/checkpoints)."""

  def __init__(self, path: epath.PathLike):
    self.path = as_path(path)
    self._best_said = False

  def __getattr__(self, name: str):
    if name in MOVED:
      raise AttributeError(f"RunDir.{name} moved: jaxencoder.model.restore_targets.{MOVED[name]}")
    raise AttributeError(f"'RunDir' object has no attribute {name!r}")

  @classmethod
  def open(cls, path: epath.PathLike) -> "RunDir":
    """An existing run: raises FileNotFoundError naming `path` if it holds no checkpoint."""
    path = as_path(path)
    if path.name == CHECKPOINTS and not (path / CHECKPOINTS).exists():
      path = path.parent
    run = cls(path)
    if run.latest_step() is None:
      raise FileNotFoundError(f"{path}: no checkpoint here (expected {path / CHECKPOINTS}/<step>/, "
                              "written by train.py or `jaxencoder-convert`)")
    return run

  @property
  def checkpoint_dir(self) -> epath.Path:
    return self.path / CHECKPOINTS

  @property
  def metrics_file(self) -> epath.Path:
    return self.path / METRICS

  @property
  def tensorboard_dir(self) -> epath.Path:
    return self.path / TENSORBOARD

  def checkpointer(self, **options) -> Checkpointer:
    """The orbax Checkpointer of `checkpoints/` (options as Checkpointer takes them)."""
    return Checkpointer(self.checkpoint_dir, **options)

  def steps(self) -> list[int]:
    """Saved steps, oldest first (finished ones only, as orbax lists them)."""
    if not self.checkpoint_dir.exists():
      return []
    manager = reader(self.checkpoint_dir)
    try:
      return sorted(manager.all_steps())
    finally:
      manager.close()

  def latest_step(self) -> int | None:
    found = self.steps()
    return found[-1] if found else None

  def record_best(self, step: int | None, metric: str = "", value: float | None = None) -> None:
    """Records `step` as the one readers take by default (a run trained with
    load_best_at_end: its best on `metric`); None removes the record."""
    path = self.path / BEST
    if step is None:
      if path.exists():
        path.unlink()
      return
    path.write_text(json.dumps({"step": step, "metric": metric, "value": value}) + "\n")

  def best_at_end(self) -> dict[str, Any] | None:
    """best.json's {"step", "metric", "value"} while that step is saved; else None."""
    path = self.path / BEST
    if not path.exists():
      return None
    best = json.loads(path.read_text())
    return best if best.get("step") in self.steps() else None

  def default_step(self) -> int | None:
    """The step readers (predict, convert, export, probe, init_from) take when none is
    named: the best one of a load_best_at_end run, else the latest."""
    best = self.best_at_end()
    return best["step"] if best else self.latest_step()

  def _step(self, step: int | None) -> int:
    found = self.steps()
    if not found:
      raise FileNotFoundError(f"{self.path}: no checkpoint in {self.checkpoint_dir}")
    if step is None:
      return found[-1]
    if step not in found:
      raise FileNotFoundError(f"{self.checkpoint_dir}: no step {step}; steps: {found}")
    return step

  # -- what a checkpoint holds. Public methods resolve `step` (default: the latest) once;
  # the private ones take a resolved step, so one call lists the directory once.
  def read_config(self, step: int | None = None) -> dict[str, Any]:
    """The JSON config saved with `step` (default: latest); {} if none was saved."""
    return self._config(self._step(step))

  def _config(self, step: int) -> dict[str, Any]:
    if not (self.checkpoint_dir / str(step) / CONFIG).exists():
      return {}  # asked of the directory: orbax's step metadata reads every item's, and a
    manager = reader(self.checkpoint_dir)  # damaged state must not hide a sound config
    try:
      restored = manager.restore(step, args=ocp.args.Composite(**{CONFIG: ocp.args.JsonRestore()}))
    finally:
      manager.close()
    return dict(restored[CONFIG] or {})

  def param_names(self, step: int | None = None) -> set[str]:
    """Top-level names under the saved state's params (e.g. {'encoder', 'mlm_head'})."""
    return {path.split("/")[0] for path in self.param_shapes(step)}

  def param_shapes(self, step: int | None = None) -> dict[str, tuple[int, ...]]:
    """The shape of each param saved with `step` (default: latest), by its path under
    params ("encoder/embeddings/token_embed/embedding"), from the step's metadata: no
    array is read."""
    manager = reader(self.checkpoint_dir)
    try:
      tree = manager.item_metadata(self._step(step))[STATE].tree
    finally:
      manager.close()
    return dict(_leaf_shapes(tree.get("params", {}), ""))

  def restore_subtree(self, abstract: Params, name: str, *, step: int | None = None) -> Params:
    """The params saved under `name` (e.g. a head: "mlm_head") into `abstract`, of `step`
    (default: the newest that restores)."""
    restore = lambda s: restore_params_only(self.checkpoint_dir, abstract,
                                            subtree=("params", name), step=s)
    return self.newest_restorable(restore, step)[1]

  def newest_restorable(self, restore: Callable[[int], T], step: int | None = None
                        ) -> tuple[int, T]:
    """(step, restore(step)) of `step` (none named: a load_best_at_end run's best one,
    see default_step), else of the newest step that restores: a damaged
    newer step (files truncated or missing) is skipped with one warning naming it and the
    step used, as train and predict skip it. Reads only. A damaged `step`, or none that
    restores: UnrestorableStep. Params that do not fit the target (ParamsMismatch), or
    any NotDamaged, raise at once: no older step fits better."""
    step = self._best_unless(step)
    saved = self.steps()
    if not saved or (step is not None and step not in saved):
      self._step(step)  # FileNotFoundError: no checkpoint, or not this step
    failures = []
    for candidate in [step] if step is not None else saved[::-1]:
      try:
        result = restore(candidate)
      except NotDamaged:
        raise
      except Exception as e:  # orbax / tensorstore raise many types for damaged files
        failures.append((candidate, e.reason if isinstance(e, UnrestorableStep)
                         else first_line(e)))
        continue
      if failures:
        log.warning("%s; using step %d", self._unrestorable(failures), candidate)
      return candidate, result
    raise self._none_restores(failures, saved, explicit=step is not None)

  def _best_unless(self, step: int | None) -> int | None:
    """`step`, or with none named the recorded best one (load_best_at_end), said once
    (a warning, so the CLIs that show warnings only say it too: not the newest step)."""
    best = self.best_at_end() if step is None else None
    if best is None:
      return step
    if not self._best_said:
      log.warning("%s: using step %d, the best on %s (%.4g; load_best_at_end)", self.path,
               best["step"], best["metric"], best["value"])
      self._best_said = True
    return best["step"]

  def _unrestorable(self, failures: list[tuple[int, str]]) -> str:
    return "; ".join(f"{self.checkpoint_dir / str(s)} cannot be restored ({why})"
                     for s, why in failures)

  def _none_restores(self, failures: list[tuple[int, str]], saved: list[int], *,
                     explicit: bool) -> "UnrestorableStep":
    if explicit:
      return UnrestorableStep(f"{self._unrestorable(failures)}; choose another step (saved: "
                              f"{', '.join(map(str, saved))})", failures[0][1])
    why = "; ".join(f"step {s}: {why}" for s, why in failures)
    return UnrestorableStep(f"no restorable checkpoint in {self.checkpoint_dir}: {why}; "
                            "restore the checkpoints from a copy, or retrain", why)

  def tokenizer_path(self) -> epath.Path | str | None:
    """The run's tokenizer: its own files in the run directory (checked against the sha256
    its run_record.json holds: RecordMismatch when they changed), else the stored
    data.tokenizer (a run made before runs kept a copy)."""
    if any((self.path / name).exists() for name in TOKENIZER_FILES):
      run_record.check_tokenizer(self.path)
      return self.path
    return (self.read_config().get("data") or {}).get("tokenizer") or None

  def read_metrics(self) -> list[dict[str, Any]]:
    return read_metrics(self.path)

  def drop_metrics_after(self, step: int) -> int:
    """Removes metrics rows past `step` (written after the checkpoint a run resumes
    from), so each (step, split) appears once; returns how many were dropped.

    Damaged lines (a crash mid-write leaves a partial last line) move to
    metrics.jsonl.damaged, appended as they were, with one warning naming file:line."""
    path = self.metrics_file
    if not path.exists():
      return 0
    text = path.read_text()
    rows, damaged = _parse_metrics(text)
    kept = [line for line, row in rows if row.get("step", 0) <= step]
    if damaged:
      damaged_file = path.parent / f"{METRICS}.damaged"
      before = damaged_file.read_text() if damaged_file.exists() else ""
      damaged_file.write_text(before + "".join(line + "\n" for _, line, _ in damaged))
      _warn_damaged(path, damaged, f"moved to {damaged_file}")
    if len(kept) < len(rows) or damaged or not text.endswith("\n"):
      path.write_text("".join(line + "\n" for line in kept))
    return len(rows) - len(kept)

  # -- creating one
  def write_params(self, params: Params, config: dict[str, Any], tokenizer=None) -> "RunDir":
    """Saves the state {"params": params} and `config` as step 0, plus the tokenizer
    files: a run made from weights alone (a converted checkpoint; the model side's
    restore_targets.write_encoder). Refuses a non-empty checkpoints/."""
    if self.checkpoint_dir.exists() and any(self.checkpoint_dir.iterdir()):
      raise FileExistsError(f"{self.checkpoint_dir}: not empty; choose a new directory")
    with self.checkpointer(save_interval_steps=1, max_to_keep=None, async_save=False) as ckpt:
      ckpt.save(0, {"params": params}, config=config, force=True)
      ckpt.wait()
    if tokenizer is not None:
      run_record.write(self.path, {"tokenizer": {"files": run_record.save_tokenizer(
          self.path, tokenizer)}, "labels": None, "data": {}, "changes": []})
    return self


def _leaf_shapes(tree, prefix: str):
  """("a/b/c", shape) of each leaf of a metadata tree (nested dicts and lists)."""
  if isinstance(tree, Mapping):
    children = tree.items()
  elif isinstance(tree, (list, tuple)):
    children = enumerate(tree)
  else:
    yield prefix, tuple(tree.shape)
    return
  for key, child in children:
    yield from _leaf_shapes(child, f"{prefix}/{key}" if prefix else str(key))


def read_metrics(workdir: epath.PathLike) -> list[dict[str, Any]]:
  """The rows of WORKDIR/metrics.jsonl ([] if there is none); damaged lines are skipped
  with one warning naming file:line (a resumed run moves them aside, see
  RunDir.drop_metrics_after)."""
  path = as_path(workdir) / METRICS
  if not path.exists():
    return []
  rows, damaged = _parse_metrics(path.read_text())
  if damaged:
    _warn_damaged(path, damaged, "skipped")
  return [row for _, row in rows]


def _parse_metrics(text: str) -> tuple[list[tuple[str, dict]], list[tuple[int, str, str]]]:
  """([(line, row)], [(line number, line, why)]): the rows, and the lines that are not
  one JSON object each."""
  rows, damaged = [], []
  for number, line in enumerate(text.splitlines(), start=1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except ValueError as e:
      damaged.append((number, line, str(e)))
      continue
    if isinstance(row, dict):
      rows.append((line, row))
    else:
      damaged.append((number, line, f"a {type(row).__name__}, not a JSON object"))
  return rows, damaged


def _warn_damaged(path, damaged: list[tuple[int, str, str]], fate: str) -> None:
  number, _, why = damaged[0]
  others = [str(n) for n, _, _ in damaged[1:]]
  also = f"; also lines {', '.join(others[:10])}{', ...' if len(others) > 10 else ''}"
  log.warning("%s:%d: damaged metrics line (%s)%s; %s", path, number, why,
              also if others else "", fate)

