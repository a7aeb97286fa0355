"""Concept erasure: affine maps that remove a property's linear trace from features.

Every eraser is an `AffineEraser`, x' = x @ matrix_DxD + bias_D (one matmul inside a model):
- `fit_leace` (Belrose et al. 2023, LEACE): the closed form r(x) = x - W^+ P W (x - mean),
  W = (Sigma_xx^{1/2})^+ the whitening, P the orthogonal projection onto the column space
  of W Sigma_xz (Sigma_xz: the cross-covariance of features and one-hot labels). After it
  Cov(x', z) = 0, so no linear classifier beats the constant one on the fitted data, and
  it is the least change (in every Sigma_xx-norm) that does so.
- `fit_inlp` (Ravfogel et al. 2020, INLP): fit a logistic probe, project the features
  onto the nullspace of its weights, repeat; the baseline.
- `random_eraser`: erases `rank` random directions, the amnesic control (Elazar et al. 2021).
Moments are accumulated `chunk_rows` rows at a time (memory O(D^2 + D C), features may be
memmaps); all arithmetic is float64.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxencoder.probing import probes

CHUNK_ROWS = 4096
EIGEN_RTOL = 1e-10  # covariance eigenvalues below this x the largest span no direction
SINGULAR_ATOL = 1e-8  # whitened cross-covariance (a correlation x std(z) <= 1/2) below it is 0


@dataclasses.dataclass(frozen=True)
class AffineEraser:
  """x' = x @ matrix_DxD + bias_D; `rank`: how many directions it erases."""
  matrix_DxD: np.ndarray
  bias_D: np.ndarray
  rank: int

  def apply(self, x_xD):
    """The erased features, in x's array type (numpy or JAX) and dtype; any leading axes."""
    bias_xD = self.bias_D.astype(x_xD.dtype).reshape((1,) * (x_xD.ndim - 1) + (-1,))
    return x_xD @ self.matrix_DxD.astype(x_xD.dtype) + bias_xD


def centred_eraser(mean_D: np.ndarray, erase_DxD: np.ndarray, rank: int) -> AffineEraser:
  """The eraser x' = x - (x - mean) @ erase_DxD as an affine map."""
  matrix_DxD = np.eye(len(mean_D)) - erase_DxD
  return AffineEraser(matrix_DxD, mean_D @ erase_DxD, int(rank))


# --- moments ------------------------------------------------------------------------------
def _checked(features_NxD, labels_N, num_classes: int | None) -> tuple[np.ndarray, int]:
  labels_N = np.asarray(labels_N)
  if (getattr(features_NxD, "ndim", 0) != 2 or labels_N.shape != (len(features_NxD),)
      or not len(labels_N)):
    raise ValueError(f"erasure needs features [N, D] and labels [N], N >= 1, got shapes "
                     f"{np.shape(features_NxD)} and {labels_N.shape}")
  if not np.issubdtype(labels_N.dtype, np.integer) or labels_N.min() < 0:
    raise ValueError("erasure labels must be class ids 0..C-1 (non-negative integers), "
                     f"got dtype {labels_N.dtype}")
  num_classes = int(labels_N.max()) + 1 if num_classes is None else num_classes
  if labels_N.max() >= num_classes:
    raise ValueError(f"label {labels_N.max()} is out of range for num_classes={num_classes}; "
                     "pass num_classes > the largest label")
  return labels_N, num_classes


def _column_mean(x_NxD, chunk_rows: int) -> np.ndarray:
  total_D = sum(np.asarray(x_NxD[s:s + chunk_rows], np.float64).sum(0)
                for s in range(0, len(x_NxD), chunk_rows))
  return total_D / len(x_NxD)


def moments(features_NxD, labels_N, num_classes: int, chunk_rows: int = CHUNK_ROWS
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(mean_D, Sigma_xx [D, D], Sigma_xz [D, C]) with z the one-hot labels; two passes of
  `chunk_rows` rows (mean first, then centred products), divided by N."""
  n = len(features_NxD)
  mean_D = _column_mean(features_NxD, chunk_rows)
  prior_C = np.bincount(labels_N, minlength=num_classes) / n
  cov_DxD = np.zeros((len(mean_D), len(mean_D)))
  xcov_DxC = np.zeros((len(mean_D), num_classes))
  for s in range(0, n, chunk_rows):
    x_RxD = np.asarray(features_NxD[s:s + chunk_rows], np.float64) - mean_D
    z_RxC = np.eye(num_classes)[labels_N[s:s + chunk_rows]] - prior_C
    cov_DxD += x_RxD.T @ x_RxD
    xcov_DxC += x_RxD.T @ z_RxC
  return mean_D, cov_DxD / n, xcov_DxC / n


# --- LEACE --------------------------------------------------------------------------------
def leace_from_moments(mean_D, cov_DxD, xcov_DxC, *, eigen_rtol: float = EIGEN_RTOL,
                       singular_atol: float = SINGULAR_ATOL) -> AffineEraser:
  """LEACE from the moments. Sigma_xx may be rank-deficient: directions with eigenvalues
  below eigen_rtol x the largest are outside the features' span and left alone."""
  eigenvalues_D, vectors_DxD = np.linalg.eigh((cov_DxD + cov_DxD.T) / 2)
  keep = eigenvalues_D > eigen_rtol * max(eigenvalues_D.max(), 0.0)
  if not keep.any():  # constant features: nothing to erase
    return centred_eraser(mean_D, np.zeros_like(cov_DxD), 0)
  v_DxK, root_K = vectors_DxD[:, keep], np.sqrt(eigenvalues_D[keep])
  whiten_DxD = (v_DxK / root_K) @ v_DxK.T  # W = (Sigma_xx^{1/2})^+
  unwhiten_DxD = (v_DxK * root_K) @ v_DxK.T  # W^+ = Sigma_xx^{1/2}
  u_DxC, singular_C, _ = np.linalg.svd(whiten_DxD @ xcov_DxC, full_matrices=False)
  u_DxR = u_DxC[:, singular_C > singular_atol]
  # column form x' = x - W^+ P W (x - mean); rows: x' = x - (x - mean) @ W P W^+ (all symmetric)
  erase_DxD = (whiten_DxD @ u_DxR) @ (u_DxR.T @ unwhiten_DxD)
  return centred_eraser(mean_D, erase_DxD, u_DxR.shape[1])


def fit_leace(features_NxD, labels_N, *, num_classes: int | None = None,
              chunk_rows: int = CHUNK_ROWS) -> AffineEraser:
  """LEACE fitted on features [N, D] and class ids [N]: afterwards the features' cross-
  covariance with the one-hot labels is 0, with the least change to the features."""
  labels_N, num_classes = _checked(features_NxD, labels_N, num_classes)
  return leace_from_moments(*moments(features_NxD, labels_N, num_classes, chunk_rows))


# --- INLP -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class InlpResult:
  """INLP's eraser and its steps. Step i's classifier was fit on the features projected by
  projections_DxD[i - 1] (the identity for i = 0); its weights, centred over classes (the
  part that moves a softmax), are weights_DxC[i]; projections_DxD[i] also kills them."""
  eraser: AffineEraser
  weights_DxC: tuple[np.ndarray, ...]
  projections_DxD: tuple[np.ndarray, ...]
  dev_accuracies: tuple[float, ...]  # each classifier's accuracy on the held-out rows


def _inlp_split(n: int, dev_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  order = np.random.default_rng(seed).permutation(n)
  cut = int(round(n * (1 - dev_fraction)))
  if not 0 < cut < n:
    raise ValueError(f"INLP needs rows for both training and the dev split: {n} rows with "
                     f"dev_fraction={dev_fraction} leave one empty; use more rows")
  return order[:cut], order[cut:]


def inlp(features_NxD, labels_N, *, iterations: int = 8, num_classes: int | None = None,
         seed: int = 0, dev_fraction: float = 0.2, probe: probes.ProbeConfig | None = None
         ) -> InlpResult:
  """Iterated nullspace projection: `iterations` times, fit a linear softmax probe (the
  project's `probes.train_probe`, early-stopped on a random `dev_fraction` of the rows) on
  the projected, centred features and project onto the nullspace of its class-centred
  weights. Holds the features in memory (float32), unlike LEACE."""
  labels_N, num_classes = _checked(features_NxD, labels_N, num_classes)
  probe = probe or probes.ProbeConfig(seed=seed)
  if probe.kind != "linear":
    raise ValueError(f"INLP projects out a linear probe's weights: probe.kind must be "
                     f"'linear', got {probe.kind!r}")
  mean_D = _column_mean(features_NxD, CHUNK_ROWS)
  x_NxD = (np.asarray(features_NxD, np.float64) - mean_D).astype(np.float32)
  train, dev = _inlp_split(len(labels_N), dev_fraction, seed)
  projection_DxD = np.eye(len(mean_D))
  weights, projections, accuracies = [], [], []
  for i in range(iterations):
    x_proj_NxD = x_NxD @ projection_DxD.astype(np.float32)
    params, info = probes.train_probe(
        x_proj_NxD[train], labels_N[train], x_proj_NxD[dev], labels_N[dev], num_classes,
        dataclasses.replace(probe, seed=probe.seed + i))
    w_DxC = np.asarray(params["w_DxC"], np.float64)
    w_DxC = w_DxC - w_DxC.mean(1, keepdims=True)
    u_DxC, singular_C, _ = np.linalg.svd(projection_DxD @ w_DxC, full_matrices=False)
    u_DxR = u_DxC[:, singular_C > 1e-6 * max(singular_C.max(initial=0.0), 1e-30)]
    projection_DxD = projection_DxD - u_DxR @ u_DxR.T  # u lies in the current range
    weights.append(w_DxC)
    projections.append(projection_DxD)
    accuracies.append(float(info["dev_accuracy"]))
  rank = len(mean_D) - int(round(np.trace(projection_DxD)))
  eraser = centred_eraser(mean_D, np.eye(len(mean_D)) - projection_DxD, rank)
  return InlpResult(eraser, tuple(weights), tuple(projections), tuple(accuracies))


def fit_inlp(features_NxD, labels_N, *, iterations: int = 8, num_classes: int | None = None,
             seed: int = 0, dev_fraction: float = 0.2, probe: probes.ProbeConfig | None = None
             ) -> AffineEraser:
  """INLP's eraser (x' = mean + (x - mean) @ P, P the product of the steps' projections);
  `inlp` returns the steps too."""
  return inlp(features_NxD, labels_N, iterations=iterations, num_classes=num_classes,
              seed=seed, dev_fraction=dev_fraction, probe=probe).eraser


# --- random control -----------------------------------------------------------------------
def random_eraser(features_NxD, rank: int, *, seed: int = 0,
                  chunk_rows: int = CHUNK_ROWS) -> AffineEraser:
  """Erases `rank` random orthonormal directions (uniform on the Grassmannian), centred on
  the features' mean like LEACE: the control for an eraser of the same rank."""
  dim = np.shape(features_NxD)[1]
  if not 0 <= rank <= dim:
    raise ValueError(f"random_eraser: rank must be in 0..{dim} (the feature size), got {rank}")
  q_DxR, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(dim, rank)))
  return centred_eraser(_column_mean(features_NxD, chunk_rows), q_DxR @ q_DxR.T, rank)
