"""text_records examples -> arrays: the text helpers the tasks' record features use
(each task's columns and arrays are in its module under jaxencoder/tasks/).

Text arrays: input_ids, token_type_ids, attention_mask, segment_ids, positions ([L],
padded to seq_len). Every example has `example_weights`; column types (labels, target,
label, answer_start) are parsed by the builder (`builders.TextRecords`).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from jaxencoder.data import packing
from jaxencoder.data.readers import DataError, as_text

TEXT_KEYS = ("input_ids", "token_type_ids")
TEXT_ARRAYS = ("input_ids", "token_type_ids", "attention_mask", "segment_ids", "positions")
Example = dict[str, Any]
NEGATIVE = re.compile(r"negative(?:_([1-9][0-9]*))?")  # negative, negative_1, negative_2, ...


def negative_columns(columns: Iterable[str]) -> list[str]:
  """The hard-negative columns among `columns`: `negative`, then `negative_<n>` by n (a
  mined set's negative_1 .. negative_k, jaxencoder-data mine)."""
  found = [(int(m.group(1) or 0), c) for c in columns if (m := NEGATIVE.fullmatch(c))]
  return [c for _, c in sorted(found)]


def optional(ex: Example, key: str) -> str | None:
  """A text column that may be absent or empty (None then)."""
  return (as_text(ex[key]) or None) if key in ex else None


def encode(tokenizer, text: str, text_b: str | None, seq_len: int, **kw) -> dict[str, np.ndarray]:
  """One text (or pair) -> the padded text arrays [seq_len] (and `offsets` when asked)."""
  enc = tokenizer.encode(text, text_b, max_length=seq_len, **kw)
  row = packing.pad_example({k: enc[k] for k in TEXT_KEYS}, seq_len, TEXT_KEYS,
                            tokenizer.pad_id)
  out = {k: row[k] for k in TEXT_ARRAYS}
  if "offsets" in enc:
    out["offsets"] = enc["offsets"]  # [n, 2], unpadded
  return out


def stacked(rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Text arrays of K rows as [K, L] arrays."""
  return {k: np.stack([r[k] for r in rows]) for k in TEXT_ARRAYS}


def checked(make: Callable[[Example], Example], columns: Sequence[str],
            task: str) -> Callable[[Example], Example]:
  """`make` on each example; a missing column is a DataError naming those `task` needs;
  an `example_index` column is kept."""
  def fn(ex):
    missing = [c for c in columns if c not in ex]
    if missing:
      have = ", ".join(sorted(k for k in ex if k != "origin"))
      raise DataError(f"{as_text(ex.get('origin', b'text_records'))}: task {task} needs columns "
                      f"{', '.join(columns)}; missing {', '.join(missing)} (has {have})")
    out = make(ex)
    if "example_index" in ex:
      out["example_index"] = np.int32(ex["example_index"])
    return out
  return fn
