"""A run's record of what its numbers mean (io/run_record.py), made and checked here.

At a fresh start the trainer copies its tokenizer into the run directory and records the
label names and the fingerprint of every split it reads. On resume the run reads text
with its own copy (a tokenizer file changed in place does not change what its ids mean),
and today's data are compared with the record: a dataset changed under the same name is
refused, naming what changed, unless data.allow_changed_data (then a warning, a
`data_changed` metrics row, and the record follows the data). A run made before records
existed gets one once, from today's files, with a warning saying so.
"""

from __future__ import annotations

import logging
from typing import Any

from jaxencoder.data import fingerprints, kinds
from jaxencoder.data.readers import DataError
from jaxencoder.data.token_ids import tokenizer_digest
from jaxencoder.io import run_record
from jaxencoder.io.run_dir import RunDir
from jaxencoder.tokenizer import Tokenizer
from jaxencoder.train import datasets

log = logging.getLogger("jaxencoder")
ROLES = ("train", "eval", "test")


class DataChangedError(DataError):
  """Resuming on data other than those the run was trained and evaluated on."""


def tokenizer_file(run_dir: RunDir, config, record: run_record.Record | None) -> str | None:
  """The tokenizer a run reads text with: its own copy when its record lists one (checked
  against the record's sha256), else data.tokenizer; None for a run without text."""
  if not kinds.kind_of(config.data.kind).text:
    return None
  if record and record.get("tokenizer"):
    run_record.check_tokenizer(run_dir.path, record)
    _warn_if_source_changed(run_dir, config, record["tokenizer"])
    return str(run_dir.path)
  return datasets.tokenizer_path(config.data)


def _warn_if_source_changed(run_dir: RunDir, config, stored: dict) -> None:
  source = datasets.tokenizer_path(config.data)
  try:
    digest = tokenizer_digest(Tokenizer.from_file(source))
  except (OSError, ValueError) as e:  # moved or unreadable: the run has its own copy
    log.warning("data.tokenizer %s cannot be read (%s); the run reads with its own copy in "
                "%s", source, str(e).splitlines()[0], run_dir.path)
    return
  if digest != stored.get("sha256"):
    log.warning("data.tokenizer %s changed since the run copied it (sha256 %s -> %s); the "
                "run keeps reading with its own copy in %s", source,
                str(stored.get("sha256"))[:12], digest[:12], run_dir.path)


def settle(run_dir: RunDir, config, pipelines, record: run_record.Record | None, *,
           step: int | None, writes: bool) -> dict[str, float] | None:
  """Checks today's labels and data against a resumed run's record (`step`: the step it
  resumes from; None for a fresh run) and writes the record (when `writes`). Returns the
  values of a `data_changed` metrics row when a change was accepted, else None. A change
  not accepted raises DataChangedError naming it."""
  seen = {"labels": pipelines.label_names, "data": pipelines.fingerprints}
  if step is None or record is None:
    if step is not None:
      log.warning("%s has no %s (made by an older jaxencoder): recording its tokenizer, "
                  "labels and data from today's files; from now on they are checked",
                  run_dir.path, run_record.RECORD)
    if writes:
      run_record.write(run_dir.path, {"tokenizer": _stored_tokenizer(run_dir, config,
                                                                     pipelines.tokenizer),
                                      **seen, "changes": []})
    return None
  differences = describe_changes(record, seen)
  if not differences:
    return None
  _refuse_unless_allowed(run_dir, config, record, seen, differences)
  log.warning("resuming on changed data (data.allow_changed_data): %s", "; ".join(differences))
  if writes:
    changes = list(record.get("changes") or []) + [{"step": step, "what": differences}]
    run_record.write(run_dir.path, {**record, **seen, "changes": changes})
  return _change_row(record, seen)


def _stored_tokenizer(run_dir: RunDir, config, tokenizer: Tokenizer | None) -> dict | None:
  if tokenizer is None:
    return None
  return {"files": run_record.save_tokenizer(run_dir.path, tokenizer),
          "sha256": tokenizer_digest(tokenizer),
          "source": str(datasets.tokenizer_path(config.data))}


def describe_changes(record: run_record.Record, seen: dict[str, Any]) -> list[str]:
  """What differs between a record's labels and data and those seen today."""
  found = []
  before, after = record.get("labels"), seen["labels"]
  if before != after:
    found.append(f"labels {_labels(before)} -> {_labels(after)}")
  stored = record.get("data") or {}
  for role in ROLES:
    old, new = stored.get(role), seen["data"].get(role)
    if old is None or new is None:
      continue  # a test split added or dropped: data.test_split says so
    found += [f"{role}: {change}" for change in fingerprints.changes(old, new)]
  return found


def _labels(names: list[str] | None) -> str:
  if names is None:
    return "none"
  shown = ", ".join(names[:6]) + (f", ... ({len(names)})" if len(names) > 6 else "")
  return f"[{shown}]"


def _refuse_unless_allowed(run_dir, config, record, seen, differences) -> None:
  what = "; ".join(differences)
  before, after = record.get("labels"), seen["labels"]
  if before is not None and after is not None and len(before) != len(after):
    raise DataChangedError(
        f"{run_dir.path} was trained on other data: {what}. Its head has {len(before)} "
        f"outputs, the data now have {len(after)} classes, so it cannot resume on them: "
        f"start a new --workdir with --config.init_from={run_dir.path}")
  if not config.data.allow_changed_data:
    raise DataChangedError(
        f"{run_dir.path} was trained on other data: {what}. Its held-out examples may now "
        "be training ones: use a new --workdir (--config.init_from=RUN starts from its "
        "weights), or --config.data.allow_changed_data=True to resume on the data as they "
        "are now")


def _change_row(record: run_record.Record, seen: dict[str, Any]) -> dict[str, float]:
  """Numbers for the metrics row that records an accepted change: examples per role,
  before and after, and the label count."""
  row = {"allow_changed_data": 1.0}
  for role in ROLES:
    old, new = (record.get("data") or {}).get(role), seen["data"].get(role)
    if old is not None and new is not None:
      row[f"{role}_examples_before"] = float(sum(e["examples"] for e in old))
      row[f"{role}_examples_after"] = float(sum(e["examples"] for e in new))
  if seen["labels"] is not None:
    row["labels"] = float(len(seen["labels"]))
  return row
