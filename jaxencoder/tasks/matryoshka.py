"""Matryoshka embeddings (Kusupati et al. 2022): the contrastive loss summed over nested
prefixes of each embedding, each prefix re-normalised, so that a vector cut to its first
m dims still retrieves. A prefix's metrics carry its size (`mrr@128`); the full
embedding's keep their plain names (`mrr`)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax

from jaxencoder.model.heads import l2_normalize

Sums = dict[str, jax.Array]
SEP = "@"  # metric@dims


@dataclasses.dataclass(frozen=True)
class Prefixes:
  """Prefix sizes, strictly decreasing (empty: off), and each one's loss weight (0: its
  metrics only, e.g. a baseline's (1, 0, 0) reports every size but trains the full)."""
  dims: tuple[int, ...] = ()
  weights: tuple[float, ...] = ()  # empty: 1 each

  @classmethod
  def from_config(cls, config) -> Prefixes:
    """From `matryoshka_dims` / `matryoshka_weights` (a config lacking them: off)."""
    return cls(tuple(config.get("matryoshka_dims", ())),
               tuple(config.get("matryoshka_weights", ())))

  def check(self, full_dim: int) -> None:
    """Raises ValueError unless these prefixes fit an embedding of `full_dim`."""
    dims, weights = self.dims, self.weights
    if not all(isinstance(d, int) and not isinstance(d, bool) and 0 < d <= full_dim
               for d in dims):
      raise ValueError(f"matryoshka_dims={dims!r}: each must be an int in 1..{full_dim} "
                       f"(the embedding's size)")
    if any(a <= b for a, b in zip(dims, dims[1:])):
      raise ValueError(f"matryoshka_dims={dims!r} must be strictly decreasing, e.g. "
                       f"({full_dim}, {full_dim // 2}, {full_dim // 4})")
    if weights and (len(weights) != len(dims) or not all(w >= 0 for w in weights)
                    or not any(w > 0 for w in weights)):
      raise ValueError(f"matryoshka_weights={weights!r}: one weight >= 0 per dim of "
                       f"matryoshka_dims={dims!r}, some > 0, or () for 1 each")

  def pairs(self) -> tuple[tuple[int, float], ...]:
    return tuple(zip(self.dims, self.weights or (1.0,) * len(self.dims)))


def prefix(z_xP: jax.Array, dims: int) -> jax.Array:
  """The first `dims` of unit vectors, re-normalised (all of them: unchanged)."""
  return z_xP if dims == z_xP.shape[-1] else l2_normalize(z_xP[..., :dims])


def nested_sums(sums_fn: Callable[..., Sums], prefixes: Prefixes, *z_xP: jax.Array) -> Sums:
  """`sums_fn(*z_xP)`'s sums of the full vectors, with each smaller prefix's as
  `key@dims` and `loss_sum` the prefixes' weighted sum of losses (the loss trained)."""
  full = sums_fn(*z_xP)
  if not prefixes.dims:
    return full
  out, full_dim, loss_sum = dict(full), z_xP[0].shape[-1], 0.0
  for dims, weight in prefixes.pairs():
    sums = full if dims == full_dim else sums_fn(*(prefix(z, dims) for z in z_xP))
    loss_sum = loss_sum + weight * sums["loss_sum"] if weight else loss_sum
    if dims != full_dim:
      out.update({f"{k}{SEP}{dims}": v for k, v in sums.items() if k != "loss_weight"})
  out["loss_sum"] = loss_sum
  return out


def by_dims(sums: dict[str, Any]) -> dict[str, dict[str, Any]]:
  """{"": the full vectors' sums, "@256": that prefix's, "@128": ...} (plain keys, the
  shared loss_weight), largest first."""
  out: dict[str, dict[str, Any]] = {"": {}}
  for key, value in sums.items():
    name, sep, dims = key.partition(SEP)
    out.setdefault(sep + dims, {"loss_weight": sums["loss_weight"]})[name] = value
  size = lambda suffix: int(suffix[len(SEP):]) if suffix else float("inf")
  return dict(sorted(out.items(), key=lambda item: -size(item[0])))


def plain_metric(metric: str) -> str:
  """`mrr@128` -> `mrr`."""
  return metric.partition(SEP)[0]
