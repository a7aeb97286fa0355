"""Static shapes for variable-length sequences: pad each one, or pack several per row.

Padded rows:  attention_mask 1 on real tokens; segment_ids = attention_mask; positions 0..n-1.
Packed rows:  segment_ids 1, 2, 3, ... per sequence (0 = padding); positions restart at 0
              in every segment; attention_mask = segment_ids > 0. A model must combine
              the padding mask with `segment_ids[:, :, None] == segment_ids[:, None, :]`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# Fill values for padding; keys not listed pad with 0.
PAD_VALUES = {"word_ids": -1}


def pad_example(ex: Mapping[str, np.ndarray], length: int, keys: Sequence[str],
                pad_id: int = 0) -> dict[str, np.ndarray]:
  """Right-pads the 1-D `keys` of one example to `length`; adds mask, segment_ids, positions."""
  n = len(ex[keys[0]])
  if n > length:
    raise ValueError(f"sequence of {n} tokens does not fit length {length}; truncate first")
  out = dict(ex)
  for k in keys:
    fill = pad_id if k == "input_ids" else PAD_VALUES.get(k, 0)
    row = np.full(length, fill, np.asarray(ex[k]).dtype)
    row[:n] = ex[k]
    out[k] = row
  real_L = (np.arange(length) < n).astype(np.int32)
  out["attention_mask"] = real_L
  out["segment_ids"] = real_L.copy()
  out["positions"] = np.where(real_L > 0, np.arange(length), 0).astype(np.int32)
  return out


def first_fit(lengths_N: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray, int]:
  """First-fit decreasing: (row_N, offset_N, rows) placing every sequence whole in a row of
  `length` slots (longest first, each in the first row with room)."""
  lengths_N = np.asarray(lengths_N, np.int64)
  if len(lengths_N) and lengths_N.max() > length:
    raise ValueError(f"a sequence of {lengths_N.max()} tokens does not fit length {length}; "
                     "truncate first")
  row_N, offset_N = np.zeros(len(lengths_N), np.int64), np.zeros(len(lengths_N), np.int64)
  used: list[int] = []  # slots taken in each row so far
  for i in np.argsort(-lengths_N, kind="stable"):
    n = int(lengths_N[i])
    r = next((r for r, u in enumerate(used) if u + n <= length), len(used))
    if r == len(used):
      used.append(0)
    row_N[i], offset_N[i] = r, used[r]
    used[r] += n
  return row_N, offset_N, len(used)


def pack_rows(rows: Mapping[str, np.ndarray], lengths_N: np.ndarray,
              length: int) -> dict[str, np.ndarray]:
  """Packs N sequences (`rows` [N, >=n_i] arrays, sequence i in row i's first n_i slots)
  into R rows of `length` (first-fit decreasing); every token appears exactly once.

  Returns each key [R, length] (0 in empty slots), plus `segment_ids` (1, 2, ... left to
  right in each row; 0 empty, after the last sequence), `positions` and `attention_mask`.
  """
  lengths_N = np.asarray(lengths_N, np.int64)
  row_N, offset_N, num_rows = first_fit(lengths_N, length)
  real_NxM = np.arange(next(iter(rows.values())).shape[1])[None, :] < lengths_N[:, None]
  token_row_T = np.repeat(row_N, lengths_N)
  token_pos_T = np.nonzero(real_NxM)[1]  # position within its sequence, row-major order
  dest_T = token_row_T * length + np.repeat(offset_N, lengths_N) + token_pos_T
  # Segment numbers left to right within each row: rank of the sequence's offset in its row.
  rank_N = np.zeros(len(lengths_N), np.int64)
  by_row = np.argsort(row_N * length + offset_N, kind="stable")
  starts = np.searchsorted(row_N[by_row], row_N[by_row], side="left")
  rank_N[by_row] = np.arange(len(by_row)) - starts
  out = {}
  for k, v in rows.items():
    flat = np.zeros(num_rows * length, np.asarray(v).dtype)
    flat[dest_T] = np.asarray(v)[real_NxM]
    out[k] = flat.reshape(num_rows, length)
  segments = np.zeros(num_rows * length, np.int32)
  segments[dest_T] = np.repeat(rank_N + 1, lengths_N)
  positions = np.zeros(num_rows * length, np.int32)
  positions[dest_T] = token_pos_T
  out["segment_ids"] = segments.reshape(num_rows, length)
  out["positions"] = positions.reshape(num_rows, length)
  out["attention_mask"] = (out["segment_ids"] > 0).astype(np.int32)
  return out


def padding_efficiency(attention_mask) -> float:
  """Real tokens / all token slots."""
  mask = np.asarray(attention_mask)
  return float(mask.sum() / mask.size) if mask.size else 0.0
