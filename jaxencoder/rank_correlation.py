"""Rank statistics in numpy, for the metrics that compare orders (a regression's Spearman,
STS's): average ranks with ties, and Spearman's rho. Imports nothing of the package."""

from __future__ import annotations

import numpy as np


def rank_average(x_N) -> np.ndarray:
  """1-based ranks of `x_N`, tied values sharing their mean rank (as scipy.stats.rankdata)."""
  x_N = np.asarray(x_N, np.float64)
  order = np.argsort(x_N, kind="stable")
  sorted_N = x_N[order]
  starts = np.flatnonzero(np.r_[True, sorted_N[1:] != sorted_N[:-1]])  # each run of ties
  ends = np.r_[starts[1:], len(x_N)]
  ranks_N = np.empty(len(x_N))
  ranks_N[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
  return ranks_N


def spearman(pred_N, target_N) -> float:
  """Spearman's rho: Pearson's r of the average ranks; 0 where either side is constant (no
  order to match)."""
  a, b = rank_average(pred_N), rank_average(target_N)
  a, b = a - a.mean(), b - b.mean()
  norm = np.sqrt((a * a).sum() * (b * b).sum())
  return float((a * b).sum() / norm) if norm > 0 else 0.0
