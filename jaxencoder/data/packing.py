"""Static shapes for variable-length sequences: pad each one, or pack several per row.

Padded rows:  attention_mask 1 on real tokens; segment_ids = attention_mask; positions 0..n-1.
Packed rows:  segment_ids 1, 2, 3, ... per sequence (0 = padding); positions restart at 0
              in every segment; attention_mask = segment_ids > 0. A model must combine
              the padding mask with `segment_ids[:, :, None] == segment_ids[:, None, :]`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grain
import numpy as np
from grain import experimental as grain_exp

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


def pack(ds: grain.IterDataset, length: int, keys: Sequence[str], *, num_bins: int,
         seed: int = 0) -> grain.IterDataset:
  """First-fit packs the 1-D `keys` of consecutive examples into rows of `length`.

  Only `keys` survive. `num_bins` rows are filled at a time (more bins, denser
  rows, more memory). Every input token appears exactly once; sequences
  longer than `length` must be truncated before.
  """
  packed = grain_exp.FirstFitPackIterDataset(
      ds.map(lambda ex: {k: ex[k] for k in keys}),
      length_struct={k: length for k in keys}, num_packing_bins=num_bins, seed=seed,
      shuffle_bins=False)
  return packed.map(lambda row: _rename_packed(row, keys))


def _rename_packed(row: Mapping[str, np.ndarray], keys: Sequence[str]) -> dict[str, np.ndarray]:
  seg_L = np.asarray(row[f"{keys[0]}_segment_ids"], np.int32)
  out = {k: np.asarray(row[k]) for k in keys}
  out["segment_ids"] = seg_L
  out["positions"] = np.asarray(row[f"{keys[0]}_positions"], np.int32)
  out["attention_mask"] = (seg_L > 0).astype(np.int32)
  return out


def padding_efficiency(attention_mask) -> float:
  """Real tokens / all token slots."""
  mask = np.asarray(attention_mask)
  return float(mask.sum() / mask.size) if mask.size else 0.0
