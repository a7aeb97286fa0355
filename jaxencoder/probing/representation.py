"""Representation health per layer: norms, cosine similarity, effective rank, anisotropy.

All functions take one layer's features `h_MxD` (numpy) and are pure. Pairwise
statistics use a seeded sample of at most `max_items` rows (they are O(M^2)).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from jaxencoder.model.config import dataclass_from_dict

COSINE_BINS = np.linspace(-1.0, 1.0, 21)


@dataclasses.dataclass(frozen=True)
class CollapseThresholds:
  """A layer is flagged as collapsed when any limit is crossed."""
  max_mean_cosine: float = 0.9  # near-identical directions
  min_effective_rank: float = 2.0  # of the centred features: almost no spread
  min_relative_spread: float = 1e-3  # centred RMS / mean norm: vectors nearly equal

  @classmethod
  def from_dict(cls, fields: Mapping[str, float] | None) -> "CollapseThresholds":
    return dataclass_from_dict(cls, fields, noun="key")


def sample_rows(h_MxD: np.ndarray, max_items: int, seed: int = 0) -> np.ndarray:
  """At most `max_items` rows, chosen without replacement by a seeded generator."""
  if len(h_MxD) <= max_items:
    return np.asarray(h_MxD, np.float64)
  rows = np.sort(np.random.default_rng(seed).choice(len(h_MxD), max_items, replace=False))
  return np.asarray(h_MxD[rows], np.float64)


def norm_stats(h_MxD: np.ndarray) -> dict[str, float]:
  norms_M = np.linalg.norm(np.asarray(h_MxD, np.float64), axis=1)
  return {"mean": float(norms_M.mean()), "std": float(norms_M.std()),
          "min": float(norms_M.min()), "max": float(norms_M.max()),
          "median": float(np.median(norms_M))}


def pairwise_cosines(h_MxD: np.ndarray) -> np.ndarray:
  """Cosine similarity of every unordered pair of distinct rows, [M(M-1)/2]."""
  h_MxD = np.asarray(h_MxD, np.float64)
  unit_MxD = h_MxD / np.maximum(np.linalg.norm(h_MxD, axis=1, keepdims=True), 1e-12)
  cos_MxM = unit_MxD @ unit_MxD.T
  return cos_MxM[np.triu_indices(len(h_MxD), k=1)]


def cosine_stats(h_MxD: np.ndarray) -> dict:
  """Mean / std / quantiles and a 20-bin histogram on [-1, 1] of pairwise cosines.

  The mean is the anisotropy of Ethayarajh (2019): the expected cosine between the
  representations of two random items (1 for a single direction, ~0 for isotropic).
  """
  cos_P = pairwise_cosines(h_MxD)
  quantiles = np.quantile(cos_P, [0.05, 0.25, 0.5, 0.75, 0.95]).tolist()
  hist = np.histogram(np.clip(cos_P, -1, 1), bins=COSINE_BINS)[0]
  return {"mean": float(cos_P.mean()), "std": float(cos_P.std()), "quantiles": quantiles,
          "histogram": (hist / max(len(cos_P), 1)).tolist()}


def effective_rank(h_MxD: np.ndarray, *, center: bool = False) -> float:
  """exp(entropy of the normalised singular values) (Roy & Vetterli 2007); 0 if all zero."""
  h_MxD = np.asarray(h_MxD, np.float64)
  scale = np.abs(h_MxD).max(initial=0.0) * np.sqrt(h_MxD.size)  # rounding-noise yardstick
  if center:
    h_MxD = h_MxD - h_MxD.mean(0, keepdims=True)
  s = np.linalg.svd(h_MxD, compute_uv=False)
  if s.sum() <= 1e-9 * scale or s.sum() == 0:
    return 0.0
  p = s / s.sum()
  p = p[p > 0]
  return float(np.exp(-(p * np.log(p)).sum()))


def top_direction_share(h_MxD: np.ndarray) -> float:
  """Share of the centred variance along the first principal direction."""
  h_MxD = np.asarray(h_MxD, np.float64)
  s = np.linalg.svd(h_MxD - h_MxD.mean(0, keepdims=True), compute_uv=False)
  total = float((s * s).sum())
  return float(s[0] ** 2 / total) if total > 0 else 1.0


def relative_spread(h_MxD: np.ndarray) -> float:
  """RMS distance to the mean vector / mean norm: 0 when all rows are equal."""
  h_MxD = np.asarray(h_MxD, np.float64)
  centred = h_MxD - h_MxD.mean(0, keepdims=True)
  rms = float(np.sqrt((centred * centred).sum(1).mean()))
  return rms / max(float(np.linalg.norm(h_MxD, axis=1).mean()), 1e-12)


def layer_health(h_MxD: np.ndarray, thresholds: CollapseThresholds = CollapseThresholds(),
                 *, max_items: int = 2000, seed: int = 0) -> dict:
  """All statistics of one layer plus `collapsed` and the reasons that fired."""
  h = sample_rows(h_MxD, max_items, seed)
  cos = cosine_stats(h)
  stats = {"norm": norm_stats(h), "cosine": cos, "anisotropy": cos["mean"],
           "effective_rank": effective_rank(h),
           "effective_rank_centered": effective_rank(h, center=True),
           "top_direction_share": top_direction_share(h), "relative_spread": relative_spread(h),
           "items": int(len(h))}
  reasons = collapse_reasons(stats, thresholds)
  return {**stats, "collapsed": bool(reasons), "collapse_reasons": reasons}


def collapse_reasons(stats: Mapping, t: CollapseThresholds) -> list[str]:
  reasons = []
  if stats["anisotropy"] > t.max_mean_cosine:
    reasons.append(f"mean cosine {stats['anisotropy']:.3f} > {t.max_mean_cosine}")
  if stats["effective_rank_centered"] < t.min_effective_rank:
    reasons.append(f"centred effective rank {stats['effective_rank_centered']:.2f} "
                   f"< {t.min_effective_rank}")
  if stats["relative_spread"] < t.min_relative_spread:
    reasons.append(f"relative spread {stats['relative_spread']:.2e} < {t.min_relative_spread}")
  return reasons


def all_layers(layers: Sequence[np.ndarray], thresholds: CollapseThresholds = CollapseThresholds(),
               *, max_items: int = 2000, seed: int = 0) -> list[dict]:
  return [{"layer": n, **layer_health(h, thresholds, max_items=max_items, seed=seed)}
          for n, h in enumerate(layers)]
