"""RUN/run_record.json: what a run's numbers mean, kept with the run.

  {"format": 1,
   "tokenizer": {"files": {"tokenizer.json": sha256, "vocab.txt": sha256, ...},
                 "sha256": the definition's digest, "source": the path it was copied from}
                or null (a run without text),
   "labels": ["neg", "pos"] or null (the class / tag names, in order),
   "data": {"train": [split fingerprint, ...], "eval": [...], "test": [...]},
   "changes": [{"step", "what"}, ...]}   # data changes accepted by allow_changed_data

The tokenizer files are the run's own copy, in the run directory (where a converted
checkpoint keeps its tokenizer too: RunDir.tokenizer_path reads them first). Storage only:
train/provenance.py decides what the record holds and what a difference means.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from etils import epath

from jaxencoder.io.paths import as_path

RECORD = "run_record.json"
FORMAT = 1
Record = dict[str, Any]


class RecordMismatch(ValueError):
  """A run's own files no longer match what its record says they were."""


def read(run_path: epath.PathLike) -> Record | None:
  """The run's record; None when it has none (a run made before records existed)."""
  path = as_path(run_path) / RECORD
  if not path.exists():
    return None
  try:
    record = json.loads(path.read_text())
  except ValueError as e:
    raise RecordMismatch(f"{path}: not readable JSON ({e}); move it aside and the run "
                         "records its files again from today's") from None
  return record if isinstance(record, dict) else None


def write(run_path: epath.PathLike, record: Record) -> None:
  """Writes the record whole: to a temporary file first, then renamed over the old one."""
  path = as_path(run_path) / RECORD
  partial = path.parent / f".{RECORD}.partial"
  partial.write_text(json.dumps({"format": FORMAT, **record}, indent=1) + "\n")
  partial.replace(path)


def sha256_file(path: epath.PathLike) -> str:
  digest = hashlib.sha256()
  with as_path(path).open("rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


TOKENIZER_NAMES = ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt")


def save_tokenizer(run_path: epath.PathLike, tokenizer) -> dict[str, str]:
  """Writes the run's copy of `tokenizer` (jaxencoder.tokenizer.Tokenizer.save) into the
  run directory; {file name: sha256} of its files there."""
  out = as_path(tokenizer.save(run_path))
  return {name: sha256_file(out / name) for name in TOKENIZER_NAMES if (out / name).exists()}


def check_tokenizer(run_path: epath.PathLike, record: Record | None = None) -> None:
  """RecordMismatch naming the first of the run's tokenizer files whose content is not
  what the record says (changed or deleted); nothing to check without a record."""
  record = read(run_path) if record is None else record
  files = ((record or {}).get("tokenizer") or {}).get("files") or {}
  for name, want in sorted(files.items()):
    path = as_path(run_path) / name
    if not path.exists():
      raise RecordMismatch(f"{path}: the run's copy of its tokenizer is missing; restore it "
                           f"from a copy of the run (its sha256 was {want[:12]})")
    if sha256_file(path) != want:
      raise RecordMismatch(f"{path}: the run's copy of its tokenizer was changed since the "
                           f"run stored it (sha256 {want[:12]} -> {sha256_file(path)[:12]}): "
                           "its ids would mean other tokens; restore the file from a copy "
                           "of the run")
