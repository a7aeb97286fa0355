"""Static shapes for variable-length sequences: pad each one, or pack several per row.

Padded rows:  attention_mask 1 on real tokens; segment_ids = attention_mask; positions 0..n-1.
Packed rows:  segment_ids 1, 2, 3, ... per sequence (0 = padding); positions restart at 0
              in every segment; attention_mask = segment_ids > 0. A model must combine
              the padding mask with `segment_ids[:, :, None] == segment_ids[:, None, :]`.

Packing modes (`data.packing`, MODES): "pad" one sequence per row; "pack" first-fit
decreasing over a fixed number of sequences at a time, each truncated to the row;
"best_fit" best-fit decreasing over a pool of whole documents filled by tokens (the
stream stage is data/pooled_packing.py), a document longer than a row cut into pieces
(`piece_lengths`) instead of truncated.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

import numpy as np

MODES = ("pad", "pack", "best_fit")  # data.packing
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


def _fitting(lengths_N, length: int) -> np.ndarray:
  lengths_N = np.asarray(lengths_N, np.int64)
  if len(lengths_N) and lengths_N.max() > length:
    raise ValueError(f"a sequence of {lengths_N.max()} tokens does not fit length {length}; "
                     "truncate first")
  return lengths_N


def first_fit(lengths_N: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray, int]:
  """First-fit decreasing: (row_N, offset_N, rows) placing every sequence whole in a row of
  `length` slots (longest first, each in the first row with room)."""
  lengths_N = _fitting(lengths_N, length)
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


def best_fit(lengths_N: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray, int]:
  """Best-fit decreasing: (row_N, offset_N, rows) as `first_fit`, but each sequence (longest
  first; ties in order) goes into the row with the least room left that still fits it
  (ties: the earliest row), a new row when none does. O(N log N + N R) for R rows."""
  lengths_N = _fitting(lengths_N, length)
  row_N, offset_N = np.zeros(len(lengths_N), np.int64), np.zeros(len(lengths_N), np.int64)
  used: list[int] = []
  rooms: list[tuple[int, int]] = []  # (room left, row) of rows not full, sorted
  for i in np.argsort(-lengths_N, kind="stable"):
    n = int(lengths_N[i])
    at = bisect.bisect_left(rooms, (n, -1))
    if at < len(rooms):
      r = rooms.pop(at)[1]
    else:
      r = len(used)
      used.append(0)
    row_N[i], offset_N[i] = r, used[r]
    used[r] += n
    if used[r] < length:
      bisect.insort(rooms, (length - used[r], r))
  return row_N, offset_N, len(used)


def pack_tokens(tokens: Mapping[str, np.ndarray], lengths_N: np.ndarray, length: int,
                fit=first_fit) -> dict[str, np.ndarray]:
  """Packs N sequences given end to end (`tokens` {key: [T]}, sequence i the next
  lengths_N[i] tokens) into R rows of `length`, placed by `fit` (`first_fit`, `best_fit`);
  every token appears exactly once, in its sequence's order.

  Returns each key [R, length] (0 in empty slots), plus `segment_ids` (1, 2, ... left to
  right in each row; 0 empty, after the last sequence), `positions` and `attention_mask`.
  """
  lengths_N = np.asarray(lengths_N, np.int64)
  row_N, offset_N, num_rows = fit(lengths_N, length)
  token_pos_T = np.arange(int(lengths_N.sum())) - np.repeat(np.cumsum(lengths_N) - lengths_N,
                                                            lengths_N)
  dest_T = np.repeat(row_N * length + offset_N, lengths_N) + token_pos_T
  # Segment numbers left to right within each row: rank of the sequence's offset in its row.
  rank_N = np.zeros(len(lengths_N), np.int64)
  by_row = np.argsort(row_N * length + offset_N, kind="stable")
  starts = np.searchsorted(row_N[by_row], row_N[by_row], side="left")
  rank_N[by_row] = np.arange(len(by_row)) - starts
  out = {}
  for k, v in tokens.items():
    flat = np.zeros(num_rows * length, np.asarray(v).dtype)
    flat[dest_T] = v
    out[k] = flat.reshape(num_rows, length)
  segments = np.zeros(num_rows * length, np.int32)
  segments[dest_T] = np.repeat(rank_N + 1, lengths_N)
  positions = np.zeros(num_rows * length, np.int32)
  positions[dest_T] = token_pos_T
  out["segment_ids"] = segments.reshape(num_rows, length)
  out["positions"] = positions.reshape(num_rows, length)
  out["attention_mask"] = (out["segment_ids"] > 0).astype(np.int32)
  return out


def pack_rows(rows: Mapping[str, np.ndarray], lengths_N: np.ndarray, length: int,
              fit=first_fit) -> dict[str, np.ndarray]:
  """`pack_tokens` of N sequences held in rows (`rows` [N, >=n_i] arrays, sequence i in
  row i's first n_i slots)."""
  lengths_N = np.asarray(lengths_N, np.int64)
  real_NxM = np.arange(next(iter(rows.values())).shape[1])[None, :] < lengths_N[:, None]
  return pack_tokens({k: np.asarray(v)[real_NxM] for k, v in rows.items()}, lengths_N,
                     length, fit)


def piece_lengths(lengths_N: np.ndarray, length: int) -> np.ndarray:
  """The lengths [P] of the pieces that cut each sequence, in order, into consecutive runs
  of `length` tokens (its last piece shorter): the same tokens end to end, as P
  sequences that each fit a row."""
  lengths_N = np.asarray(lengths_N, np.int64)
  count_N = -(-lengths_N // length)
  pieces_P = np.full(int(count_N.sum()), length, np.int64)
  last_N = lengths_N - (count_N - 1) * length
  pieces_P[np.cumsum(count_N)[count_N > 0] - 1] = last_N[count_N > 0]
  return pieces_P


WIDEN = 4  # whole_documents reads a document that fills its row again this much wider


def whole_documents(rows_of, index_N: np.ndarray, width: int):
  """({key: [T]}, lengths [N]): documents `index_N` whole, end to end in order.

  `rows_of(index_M, width)` -> ({key: [M, width]}, lengths [M]) reads M documents into
  rows `width` wide, a longer one cut to the row; a document that fills its row is read
  again WIDEN times wider until none does. So the rows read hold about the tokens read,
  whatever the longest document (a cut keeps a tokenizer's closing special: only a
  document shorter than the row is known whole)."""
  index_N = np.asarray(index_N, np.int64)
  todo, parts = np.arange(len(index_N)), []
  while True:
    rows, lengths_M = rows_of(index_N[todo], width)
    whole_M = np.asarray(lengths_M) < width
    parts.append((todo[whole_M], {k: v[whole_M] for k, v in rows.items()}, lengths_M[whole_M]))
    todo, width = todo[~whole_M], width * WIDEN
    if not len(todo):
      break
  lengths_N = np.zeros(len(index_N), np.int64)
  for at_M, _, part_M in parts:
    lengths_N[at_M] = part_M
  starts_N = np.cumsum(lengths_N) - lengths_N
  tokens = {k: np.zeros(int(lengths_N.sum()), v.dtype) for k, v in parts[0][1].items()}
  for at_M, rows, part_M in parts:
    real_MxW = np.arange(next(iter(rows.values())).shape[1])[None, :] < part_M[:, None]
    dest_T = np.repeat(starts_N[at_M], part_M) + np.nonzero(real_MxW)[1]
    for k, v in rows.items():
      tokens[k][dest_T] = v[real_MxW]
  return tokens, lengths_N


def padding_efficiency(attention_mask) -> float:
  """Real tokens / all token slots."""
  mask = np.asarray(attention_mask)
  return float(mask.sum() / mask.size) if mask.size else 0.0
