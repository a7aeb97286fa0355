"""Several text sources read as one, in fixed proportions (`data.sources`).

Member k's examples are shuffled by seed + k and, for training, repeated without end;
the members are interleaved by grain's `MapDataset.mix`, which gives the example at
global index g from a fixed pattern of the weights: source k supplies, of every
prefix of the stream, its weight's share (up to one example). So example g is a pure
function of the seed and g: the same for any number of workers and processes, and a
resumed run goes on exactly (the pipeline's state is the global position). Member
examples keep their own stored token ids (or are tokenised), as a single source's.
"""

from __future__ import annotations

from collections.abc import Sequence

import grain
import numpy as np

from jaxencoder.data import token_ids


def parse_weights(spec: str) -> list[tuple[str, float]]:
  """"a:0.7,b:0.3" -> [("a", 0.7), ("b", 0.3)] (a missing weight is 1); weights are
  relative (normalised by their sum). A ValueError names a bad entry."""
  out = []
  for part in (p.strip() for p in spec.split(",") if p.strip()):
    name, colon, weight = part.rpartition(":")
    if not colon or "/" in weight:  # no weight: "name", "gs://bucket/dir"
      name, weight = part, "1"
    try:
      value = float(weight)
    except ValueError:
      value = float("nan")
    if not name or not value > 0 or value == float("inf"):
      raise ValueError(f"data.sources entry {part!r}: write NAME:WEIGHT with a weight > 0, "
                       "e.g. shakespeare:0.7,austen:0.3")
    out.append((name, value))
  names = [n for n, _ in out]
  if len(set(names)) != len(names):
    raise ValueError(f"data.sources names a source twice: {spec!r}")
  if not out:
    raise ValueError("data.sources is empty")
  return out


class Mixture:
  """Random-access examples of `members` (sources) in proportions `weights`.

  `order(read)`: the global stream as (member, record) pairs (endless for training:
  `num_epochs=None`; one pass otherwise, as long as every member lasts); `text_rows`
  gathers rows from each member's stored ids, or tokenises its texts.
  """

  def __init__(self, members: Sequence, weights: Sequence[float], names: Sequence[str]):
    self.members, self.names = list(members), list(names)
    total = float(sum(weights))
    self.weights = [w / total for w in weights]

  def order(self, seed: int | None, num_epochs: int | None) -> grain.MapDataset:
    """(member, record) of each global index: members shuffled by seed + k, repeated
    `num_epochs` times (None: endless), interleaved by weight."""
    streams = []
    for k, member in enumerate(self.members):
      ds = grain.MapDataset.range(len(member))
      if seed is not None:
        ds = ds.shuffle(seed=seed + k)
      streams.append(ds.repeat(num_epochs).map(lambda r, k=k: (k, r)))
    return grain.MapDataset.mix(streams, self.weights)

  def proportions(self, count: int) -> dict[str, float]:
    """Each member's share of the first `count` examples of the stream (the realised mix)."""
    order = self.order(None, None)
    picks = np.bincount([order[i][0] for i in range(count)], minlength=len(self.members))
    return {name: float(n) / max(count, 1) for name, n in zip(self.names, picks)}

  def stored(self, tokenizer) -> list:
    """Each member's stored token ids (`token_ids.stored`; None where it has none)."""
    return [token_ids.stored(member, tokenizer) for member in self.members]

  def text_rows(self, picks: Sequence[tuple[int, int]], rows_of) -> tuple[np.ndarray, ...]:
    """`input_ids`, `word_ids` [N, L] and lengths [N] of the (member, record) `picks`,
    each member's from `rows_of(k, records_M)` (the same arrays for its M picks)."""
    member_N = np.array([k for k, _ in picks], np.int64)
    record_N = np.array([r for _, r in picks], np.int64)
    if not len(picks):  # a process's chunk of fill rows only
      return rows_of(0, record_N)
    out = None
    for k in np.unique(member_N):
      at = member_N == k
      part = rows_of(int(k), record_N[at])
      if out is None:
        out = [np.zeros((len(picks),) + a.shape[1:], a.dtype) for a in part]
      for whole, a in zip(out, part):
        whole[at] = a
    return tuple(out)
