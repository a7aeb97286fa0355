"""Centered kernel alignment (CKA; Kornblith et al. 2019) between representations.

`cka(x_NxP, y_NxQ, kernel="linear" | "rbf", unbiased=False)` compares two sets of
representations of the same N inputs (rows paired): 1 for representations that differ by
an orthogonal map and an isotropic scale, near 0 for unrelated ones. The biased estimator
is HSIC(K, L) = tr(K H L H) / (n - 1)^2 with H the centering matrix; the unbiased one
(Song et al. 2012) drops the kernels' diagonals and corrects for their row sums, which
removes the upward bias of CKA between high-dimensional random features at small N.
Linear CKA without the unbiased option is computed from the features ([P, Q] products,
no [N, N] kernel); the other variants build [N, N] Gram matrices, so they subsample.
`layer_cka(layers_a, layers_b)`: the [A, B] matrix over every pair of layers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

KERNELS = ("linear", "rbf")
MAX_GRAM_ROWS = 4096  # rows kept for [N, N] kernels (RBF, unbiased): 128 MiB per kernel
CHUNK_ROWS = 8192  # rows per step of layer_cka's linear products (memmapped layers stay on disk)


def _centered(x_NxP: np.ndarray) -> np.ndarray:
  x_NxP = np.asarray(x_NxP, np.float64)
  return x_NxP - x_NxP.mean(0, keepdims=True)


def linear_cka_features(x_NxP, y_NxQ) -> float:
  """Biased linear CKA from the features: ||Y^T X||_F^2 / (||X^T X||_F ||Y^T Y||_F)."""
  x_NxP, y_NxQ = _centered(x_NxP), _centered(y_NxQ)
  cross = np.linalg.norm(y_NxQ.T @ x_NxP) ** 2
  denominator = np.linalg.norm(x_NxP.T @ x_NxP) * np.linalg.norm(y_NxQ.T @ y_NxQ)
  return float(cross / denominator) if denominator > 0 else 0.0


def gram(x_NxP, kernel: str = "linear", sigma_fraction: float = 1.0) -> np.ndarray:
  """The [N, N] kernel matrix. RBF: exp(-d^2 / (2 s^2)), s = sigma_fraction times the
  median pairwise distance."""
  x_NxP = np.asarray(x_NxP, np.float64)
  dot_NxN = x_NxP @ x_NxP.T
  if kernel == "linear":
    return dot_NxN
  if kernel != "rbf":
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
  sq_norms_N = np.diag(dot_NxN)
  sq_dist_NxN = np.maximum(sq_norms_N[:, None] + sq_norms_N[None, :] - 2 * dot_NxN, 0.0)
  off_diagonal = sq_dist_NxN[~np.eye(len(x_NxP), dtype=bool)]
  median_sq = float(np.median(off_diagonal)) if off_diagonal.size else 0.0
  if median_sq <= 0:
    return np.ones_like(sq_dist_NxN)  # all points equal: every pair maximally similar
  return np.exp(-sq_dist_NxN / (2 * sigma_fraction ** 2 * median_sq))


def hsic(k_NxN: np.ndarray, l_NxN: np.ndarray, unbiased: bool = False) -> float:
  """HSIC of two kernel matrices: biased tr(K H L H) / (n-1)^2, or Song et al.'s unbiased
  estimator (n >= 4)."""
  n = len(k_NxN)
  if not unbiased:
    k_centered = k_NxN - k_NxN.mean(0, keepdims=True) - k_NxN.mean(1, keepdims=True) + k_NxN.mean()
    return float(np.sum(k_centered * l_NxN) / (n - 1) ** 2)
  if n < 4:
    raise ValueError(f"unbiased HSIC needs at least 4 examples, got {n}")
  k_NxN = k_NxN - np.diag(np.diag(k_NxN))
  l_NxN = l_NxN - np.diag(np.diag(l_NxN))
  k_rows_N, l_rows_N = k_NxN.sum(1), l_NxN.sum(1)
  trace = np.sum(k_NxN * l_NxN)
  totals = k_rows_N.sum() * l_rows_N.sum() / ((n - 1) * (n - 2))
  rows = 2.0 / (n - 2) * (k_rows_N @ l_rows_N)
  return float((trace + totals - rows) / (n * (n - 3)))


def cka(x_NxP, y_NxQ, kernel: str = "linear", *, unbiased: bool = False,
        sigma_fraction: float = 1.0, max_rows: int = MAX_GRAM_ROWS, seed: int = 0) -> float:
  """CKA between two representations of the same N inputs (rows paired)."""
  x_NxP, y_NxQ = np.asarray(x_NxP), np.asarray(y_NxQ)
  if x_NxP.ndim != 2 or y_NxQ.ndim != 2 or len(x_NxP) != len(y_NxQ):
    raise ValueError(f"CKA compares [N, P] and [N, Q] representations of the same N inputs, "
                     f"got shapes {x_NxP.shape} and {y_NxQ.shape}")
  if kernel not in KERNELS:
    raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
  if kernel == "linear" and not unbiased:
    return linear_cka_features(x_NxP, y_NxQ)
  if len(x_NxP) > max_rows:  # the same rows of both
    keep = np.sort(np.random.default_rng(seed).choice(len(x_NxP), max_rows, replace=False))
    x_NxP, y_NxQ = x_NxP[keep], y_NxQ[keep]
  k_NxN = gram(x_NxP, kernel, sigma_fraction)
  l_NxN = gram(y_NxQ, kernel, sigma_fraction)
  xy = hsic(k_NxN, l_NxN, unbiased)
  xx, yy = hsic(k_NxN, k_NxN, unbiased), hsic(l_NxN, l_NxN, unbiased)
  return float(xy / np.sqrt(xx * yy)) if xx > 0 and yy > 0 else 0.0


def layer_cka(layers_a: Sequence, layers_b: Sequence | None = None, kernel: str = "linear",
              **kwargs) -> np.ndarray:
  """[A, B] CKA of every layer of `layers_a` (each [N, P]) against every layer of
  `layers_b` (default: `layers_a` itself, then symmetric with ones on the diagonal)."""
  if kernel == "linear" and not kwargs.get("unbiased"):
    return _linear_layer_cka(layers_a, layers_b)
  same = layers_b is None
  layers_b = layers_a if same else layers_b
  out_AxB = np.zeros((len(layers_a), len(layers_b)))
  for i, x_NxP in enumerate(layers_a):
    for j, y_NxQ in enumerate(layers_b):
      if same and j < i:
        out_AxB[i, j] = out_AxB[j, i]
      else:
        out_AxB[i, j] = cka(x_NxP, y_NxQ, kernel, **kwargs)
  return out_AxB


def _linear_layer_cka(layers_a, layers_b=None) -> np.ndarray:
  """Biased linear CKA of every layer pair over every item, as `linear_cka_features` per
  pair, with each layer's mean and ||Xc^T Xc|| made once (one [P, Q] product per pair, not
  three) and the rows read CHUNK_ROWS at a time (layers may be memmaps)."""
  same = layers_b is None
  layers_b = layers_a if same else layers_b
  means_a = [_column_mean(x_NxP) for x_NxP in layers_a]
  means_b = means_a if same else [_column_mean(y_NxQ) for y_NxQ in layers_b]
  norms_a = [np.linalg.norm(_centred_product(x, x, m, m)) for x, m in zip(layers_a, means_a)]
  norms_b = norms_a if same else [np.linalg.norm(_centred_product(y, y, m, m))
                                  for y, m in zip(layers_b, means_b)]
  out_AxB = np.zeros((len(layers_a), len(layers_b)))
  for i, j in np.ndindex(out_AxB.shape):
    denominator = norms_a[i] * norms_b[j]
    if same and j <= i:
      out_AxB[i, j] = out_AxB[j, i] if j < i else float(denominator > 0)
    elif denominator > 0:
      cross_PxQ = _centred_product(layers_a[i], layers_b[j], means_a[i], means_b[j])
      out_AxB[i, j] = np.linalg.norm(cross_PxQ) ** 2 / denominator
  return out_AxB


def _column_mean(x_NxP) -> np.ndarray:
  total_P = sum(np.asarray(x_NxP[s:s + CHUNK_ROWS], np.float64).sum(0)
                for s in range(0, len(x_NxP), CHUNK_ROWS))
  return total_P / len(x_NxP)


def _centred_product(x_NxP, y_NxQ, mean_x_P, mean_y_Q) -> np.ndarray:
  """[P, Q] (X - mean)^T (Y - mean) in float64, CHUNK_ROWS rows at a time."""
  out_PxQ = np.zeros((x_NxP.shape[1], y_NxQ.shape[1]))
  for s in range(0, len(x_NxP), CHUNK_ROWS):
    x_CxP = np.asarray(x_NxP[s:s + CHUNK_ROWS], np.float64) - mean_x_P
    out_PxQ += x_CxP.T @ (np.asarray(y_NxQ[s:s + CHUNK_ROWS], np.float64) - mean_y_Q)
  return out_PxQ
