"""Best-fit packing of a stream of documents through a bounded pool (`data.packing="best_fit"`).

The stream's elements are chunks of pieces: {"tokens": {key: [T]}, "lengths": [P]}, P
pieces (documents, or pieces of one longer than a row) end to end. The pool takes the
pieces that follow, whole, until it holds at least `pool_tokens` tokens (or the stream
ends), packs them by best-fit decreasing (`packing.best_fit`) into rows of `length`,
emits every row, then starts the next pool. Only a pool's last rows are partly empty,
so the fill grows with the pool: about 1 - 1 / (2 x pool rows) on short documents.

Memory holds one pool and one chunk. The iterator's state is where its pool began (the
chunk stream's state before that chunk and the pieces of it taken already) and how many
of its rows were emitted: a restore re-reads and re-packs that pool, so a resumed
iterator yields exactly the rows an uninterrupted one would (grain's own packing
iterators checkpoint the same way). The rows depend only on the stream of pieces, not
on how many workers made it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grain
import numpy as np

from jaxencoder.data import packing


class BestFitRows(grain.IterDataset):
  """Rows [length] of `parent`'s chunks of pieces, packed a pool at a time; `finish`
  completes each pool's packed [R, length] arrays (e.g. padding ids, extra keys)."""

  def __init__(self, parent: grain.IterDataset, length: int, pool_tokens: int,
               finish: Callable[[dict], dict] = lambda rows: rows):
    super().__init__(parent)
    self.length, self.pool_tokens, self.finish = length, pool_tokens, finish

  def __iter__(self) -> _BestFitIterator:
    return _BestFitIterator(self._parent.__iter__(), self)


class _BestFitIterator(grain.DatasetIterator):
  """Emits the rows of one packed pool after another (module docstring: the state)."""

  def __init__(self, parent: grain.DatasetIterator, spec: BestFitRows):
    super().__init__(parent)
    self._spec = spec
    self._seek(parent.get_state(), 0)

  def _seek(self, chunk_state: dict[str, Any], taken: int) -> None:
    """The next pool starts after chunk_state's chunk's first `taken` pieces."""
    self._chunk_state, self._chunk, self._taken = chunk_state, None, 0
    if taken:
      self._read_chunk()
      self._taken = taken
    self._pool_start = (chunk_state, taken)
    self._rows, self._emitted = None, 0

  def get_state(self) -> dict[str, Any]:
    chunk_state, taken = self._pool_start
    return {"chunk_state": chunk_state, "taken": taken, "emitted": self._emitted}

  def set_state(self, state: dict[str, Any]) -> None:
    self._parent.set_state(state["chunk_state"])
    self._seek(state["chunk_state"], state["taken"])
    if state["emitted"]:
      self._rows, self._emitted = self._next_pool(), state["emitted"]

  def __next__(self) -> dict[str, np.ndarray]:
    if self._rows is None or self._emitted == len(self._rows["segment_ids"]):
      self._pool_start = (self._chunk_state, self._taken)
      self._rows, self._emitted = self._next_pool(), 0
      if self._rows is None:
        raise StopIteration
    row = {k: v[self._emitted] for k, v in self._rows.items()}
    self._emitted += 1
    return row

  def _next_pool(self) -> dict[str, np.ndarray] | None:
    """The next pool's packed rows [R, length]; None at the end of the stream."""
    parts, lengths, total = [], [], 0
    while total < self._spec.pool_tokens:
      if self._chunk is None or self._taken == len(self._chunk["lengths"]):
        if not self._read_chunk():
          break
        continue
      lengths_P = np.asarray(self._chunk["lengths"], np.int64)[self._taken:]
      take = int(np.searchsorted(np.cumsum(lengths_P), self._spec.pool_tokens - total)) + 1
      start = int(np.sum(self._chunk["lengths"][:self._taken]))
      part_P = lengths_P[:take]
      end = start + int(part_P.sum())
      parts.append({k: v[start:end] for k, v in self._chunk["tokens"].items()})
      lengths.append(part_P)
      total += int(part_P.sum())
      self._taken += len(part_P)
    if not total:
      return None
    tokens = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    rows = packing.pack_tokens(tokens, np.concatenate(lengths), self._spec.length,
                               fit=packing.best_fit)
    return self._spec.finish(rows)

  def _read_chunk(self) -> bool:
    """Reads the next chunk; False at the end of the stream."""
    state = self._parent.get_state()
    try:
      chunk = next(self._parent)
    except StopIteration:
      return False
    self._chunk_state, self._chunk, self._taken = state, chunk, 0
    return True
