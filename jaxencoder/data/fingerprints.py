"""What identifies the examples a run reads: one fingerprint per split of a prepared dataset.

`split_fingerprints(source)` takes a source as the trainer opens it (a prepared split, a
view of one, an --ids-only split, or a Mixture of them) and gives one entry per
underlying split: {"dataset", "split", "examples", "sha256", "files"}. The sha256 covers
what the dataset was built from (its fingerprint.json: each input file's sha256 and the
options), the split's name and size (its shards' lengths), so re-preparing a dataset
under the same name from other files changes it. `changes(old, new)` names what differs.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from etils import epath

from jaxencoder.data import token_ids

MAX_FILES = 200  # input files listed per entry (to name the changed ones); more: only counted
Entry = dict[str, Any]


def split_fingerprints(source) -> list[Entry]:
  """The fingerprint of each prepared split under `source` ([] when none is found: a
  source built in memory)."""
  members = getattr(source, "members", None)
  if members is not None:
    return [entry for member in members for entry in split_fingerprints(member)]
  while not hasattr(source, "dataset_info") and hasattr(source, "source"):
    source = source.source  # a view (a held-out part, a subset): the split behind it
  info = getattr(source, "dataset_info", None)
  if info is None or getattr(info, "data_dir", None) is None:
    return []
  return [_entry(epath.Path(str(info.data_dir)), source.split, info)]


def _entry(dataset_dir: epath.Path, split: str, info) -> Entry:
  built_from = _read_json(dataset_dir / token_ids.FINGERPRINT)
  shards, examples = _split_shape(dataset_dir, split, info)
  identity = {"built_from": _without_paths(built_from), "split": split, "shards": shards}
  if built_from is None:  # a dataset tfds prepared: its own description of the split
    identity["dataset_info"] = _read_json(dataset_dir / "dataset_info.json")
  digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode("utf-8")).hexdigest()
  files = (built_from or {}).get("files") or {}
  return {"dataset": str(dataset_dir), "split": split, "examples": examples, "sha256": digest,
          "files": files if len(files) <= MAX_FILES else {"count": len(files)}}


def _split_shape(dataset_dir: epath.Path, split: str, info) -> tuple[list[int], int]:
  """(examples per shard, examples) of one split."""
  splits = getattr(info, "splits", None)
  if splits is not None:  # a tfds dataset_info
    lengths = [int(n) for n in splits[split].shard_lengths]
    return lengths, int(splits[split].num_examples)
  entry = token_ids.read_manifest(dataset_dir)["splits"][split]  # --ids-only
  return [int(shard["examples"]) for shard in entry["shards"]], int(entry["examples"])


def _without_paths(built_from: dict | None) -> dict | None:
  """What a dataset was built from, less where things lay (a moved dataset is the same)."""
  if built_from is None or "tokenizer" not in built_from:
    return built_from
  return {**built_from, "tokenizer": {"sha256": built_from["tokenizer"].get("sha256")}}


def _read_json(path: epath.Path) -> dict | None:
  return json.loads(path.read_text()) if path.exists() else None


def changes(old: list[Entry], new: list[Entry]) -> list[str]:
  """What differs between two lists of split fingerprints, one phrase per changed split
  ([] when they match)."""
  if len(old) != len(new):  # another mixture
    return [f"other datasets ({_names(old)} -> {_names(new)})"]
  found = []
  for before, after in zip(old, new):
    if before["sha256"] == after["sha256"]:
      continue
    what = [f"{before['examples']} -> {after['examples']} examples"
            if before["examples"] != after["examples"] else "same number of examples"]
    what += _file_changes(before.get("files") or {}, after.get("files") or {})
    where = (before["dataset"] if before["dataset"] == after["dataset"]
             else f"{before['dataset']} -> {after['dataset']}")
    found.append(f"split {after['split']!r} of {where} ({', '.join(what)})")
  return found


def _names(entries: list[Entry]) -> str:
  return ", ".join(f"{e['dataset']}:{e['split']}" for e in entries) or "none"


def _file_changes(before: dict, after: dict) -> list[str]:
  if "count" in before or "count" in after:
    return ["its source files changed"] if before != after else []
  phrases = []
  for verb, names in (("added", sorted(after.keys() - before.keys())),
                      ("removed", sorted(before.keys() - after.keys())),
                      ("changed", sorted(k for k in before.keys() & after.keys()
                                         if before[k] != after[k]))):
    if names:
      more = f" and {len(names) - 3} more" if len(names) > 3 else ""
      phrases.append(f"{verb} {', '.join(names[:3])}{more}")
  return phrases or ["the options it was prepared with changed"]
