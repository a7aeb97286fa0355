"""Concept erasure (jaxencoder.probing.erasure): LEACE against its closed form written here
with numpy's pseudo-inverses, its guarantees (zero cross-covariance, a probe at the majority
baseline, no edit when there is nothing to erase), INLP's nullspaces, the random control."""

import jax.numpy as jnp
import numpy as np
import pytest

from jaxencoder.probing import erasure, probes


def gaussian_classes(n=3000, dim=8, priors=(0.5, 0.3, 0.2), scale=1.5, seed=0):
  """Features [n, dim] whose class means differ, correlated noise; labels [n]."""
  rng = np.random.default_rng(seed)
  labels_N = rng.choice(len(priors), size=n, p=priors)
  means_CxD = scale * rng.normal(size=(len(priors), dim))
  mixing_DxD = rng.normal(size=(dim, dim)) / np.sqrt(dim)
  return rng.normal(size=(n, dim)) @ mixing_DxD + means_CxD[labels_N] + 3.0, labels_N


def cross_covariance(x_NxD, labels_N, num_classes):
  z_NxC = np.eye(num_classes)[labels_N]
  return (x_NxD - x_NxD.mean(0)).T @ (z_NxC - z_NxC.mean(0)) / len(x_NxD)


def direct_leace(x_NxD, labels_N, rcond=1e-6):
  """r(x) = x - W^+ P W (x - mean), W = (Sigma_xx^{1/2})^+, P = M M^+ with M = W Sigma_xz:
  Belrose et al. (2023), Theorem 3.1, in column form, unchunked. `rcond` drops the roots
  of Sigma_xx's zero eigenvalues (~1e-8 of the largest root after rounding)."""
  z_NxC = np.eye(labels_N.max() + 1)[labels_N]
  mean_D = x_NxD.mean(0)
  sigma_xx = np.cov(x_NxD.T, bias=True)
  sigma_xz = (x_NxD - mean_D).T @ (z_NxC - z_NxC.mean(0)) / len(x_NxD)
  eigenvalues, vectors = np.linalg.eigh(sigma_xx)
  root = vectors @ np.diag(np.sqrt(np.clip(eigenvalues, 0, None))) @ vectors.T
  w = np.linalg.pinv(root, rcond=rcond, hermitian=True)
  m = w @ sigma_xz
  p = m @ np.linalg.pinv(m, rcond=rcond)
  edit = np.linalg.pinv(w, rcond=rcond, hermitian=True) @ p @ w
  return x_NxD - (edit @ (x_NxD - mean_D).T).T


def rank_deficient(x_NxD):
  """x with two more columns that are sums of others: Sigma_xx has a 2-dim nullspace."""
  return np.concatenate([x_NxD, x_NxD[:, :2] + x_NxD[:, 2:4]], axis=1)


@pytest.mark.parametrize("deficient", [False, True], ids=["full_rank", "rank_deficient"])
def test_leace_leaves_no_cross_covariance(deficient):
  x_NxD, labels_N = gaussian_classes()
  x_NxD = rank_deficient(x_NxD) if deficient else x_NxD
  eraser = erasure.fit_leace(x_NxD, labels_N)
  assert eraser.rank == 2  # C - 1: the one-hot columns sum to one
  assert np.abs(cross_covariance(x_NxD, labels_N, 3)).max() > 0.1
  np.testing.assert_allclose(cross_covariance(eraser.apply(x_NxD), labels_N, 3), 0, atol=1e-6)


@pytest.mark.parametrize("deficient", [False, True], ids=["full_rank", "rank_deficient"])
def test_leace_equals_the_closed_form(deficient):
  x_NxD, labels_N = gaussian_classes(n=60, dim=5, seed=1)
  x_NxD = rank_deficient(x_NxD) if deficient else x_NxD
  eraser = erasure.fit_leace(x_NxD, labels_N)
  np.testing.assert_allclose(eraser.apply(x_NxD), direct_leace(x_NxD, labels_N),
                             rtol=0, atol=1e-9)


def test_a_logistic_probe_falls_to_the_majority_baseline():
  x_NxD, labels_N = gaussian_classes(n=4000)
  splits = probes.split_items(np.arange(len(labels_N)), seed=0)
  cfg = probes.ProbeConfig(seed=0)
  majority = probes.majority_accuracy(labels_N[splits["train"]], labels_N[splits["test"]])
  eraser = erasure.fit_leace(x_NxD[splits["train"]], labels_N[splits["train"]])
  before = probes.probe_layer(x_NxD, labels_N, splits, 3, cfg)["accuracy"]
  after = probes.probe_layer(eraser.apply(x_NxD), labels_N, splits, 3, cfg)["accuracy"]
  sampling_error = np.sqrt(majority * (1 - majority) / len(splits["test"]))
  assert before > majority + 0.2
  assert abs(after - majority) <= 3 * sampling_error, (before, after, majority)


@pytest.mark.parametrize("num_classes", [2, 3])
def test_leace_leaves_features_without_the_property_unchanged(num_classes):
  """Every class holds the same rows (reordered): the class means agree, Sigma_xz = 0."""
  rng = np.random.default_rng(2)
  base_MxD = rng.normal(size=(200, 6)) @ rng.normal(size=(6, 6)) + 1.0
  x_NxD = np.concatenate([base_MxD[rng.permutation(200)] for _ in range(num_classes)])
  labels_N = np.repeat(np.arange(num_classes), 200)
  eraser = erasure.fit_leace(x_NxD, labels_N)
  assert eraser.rank == 0
  np.testing.assert_allclose(eraser.apply(x_NxD), x_NxD, rtol=0, atol=1e-12)


def test_chunked_moments_equal_one_pass_and_read_memmaps(tmp_path):
  x_NxD, labels_N = gaussian_classes(n=1000)
  on_disk = np.lib.format.open_memmap(tmp_path / "x.npy", "w+", np.float32, x_NxD.shape)
  on_disk[:] = x_NxD
  one_pass = erasure.fit_leace(on_disk, labels_N, chunk_rows=10_000)
  chunked = erasure.fit_leace(on_disk, labels_N, chunk_rows=37)
  np.testing.assert_allclose(chunked.matrix_DxD, one_pass.matrix_DxD, rtol=0, atol=1e-10)
  np.testing.assert_allclose(chunked.bias_D, one_pass.bias_D, rtol=0, atol=1e-10)


def test_apply_keeps_array_type_dtype_and_leading_axes():
  x_NxD, labels_N = gaussian_classes(n=500)
  eraser = erasure.fit_leace(x_NxD, labels_N)
  x_BxLxD = x_NxD[:480].reshape(4, 120, -1).astype(np.float32)
  expected = eraser.apply(x_NxD[:480]).reshape(4, 120, -1)
  out = eraser.apply(jnp.asarray(x_BxLxD))
  assert isinstance(out, type(jnp.zeros(1))) and out.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(out), expected, atol=1e-4)
  assert eraser.apply(x_BxLxD).dtype == np.float32


def test_labels_must_be_class_ids_of_every_row():
  x_NxD, labels_N = gaussian_classes(n=100)
  with pytest.raises(ValueError, match=r"features \[N, D\] and labels \[N\]"):
    erasure.fit_leace(x_NxD, labels_N[:-1])
  with pytest.raises(ValueError, match="class ids"):
    erasure.fit_leace(x_NxD, labels_N.astype(float))
  with pytest.raises(ValueError, match="num_classes"):
    erasure.fit_leace(x_NxD, labels_N, num_classes=2)


def test_inlp_projects_each_classifier_into_the_next_nullspace():
  x_NxD, labels_N = gaussian_classes(n=2000, dim=10)
  result = erasure.inlp(x_NxD, labels_N, iterations=3)
  final_DxD = result.eraser.matrix_DxD
  for w_DxC, projection_DxD in zip(result.weights_DxC, result.projections_DxD):
    assert np.linalg.norm(w_DxC) > 0.1
    assert np.linalg.norm(projection_DxD @ w_DxC) <= 1e-6 * np.linalg.norm(w_DxC)
    assert np.linalg.norm(final_DxD @ w_DxC) <= 1e-6 * np.linalg.norm(w_DxC)
  np.testing.assert_allclose(final_DxD, result.projections_DxD[-1])
  np.testing.assert_allclose(final_DxD @ final_DxD, final_DxD, atol=1e-10)  # a projection
  np.testing.assert_allclose(final_DxD, final_DxD.T, atol=1e-10)  # orthogonal
  assert result.eraser.rank == 10 - round(np.trace(final_DxD)) == 6  # C - 1 per step
  assert result.dev_accuracies[0] > 0.9 > result.dev_accuracies[-1]


@pytest.mark.parametrize("rank", [0, 3])
def test_random_eraser_removes_rank_directions_and_is_idempotent(rank):
  x_NxD, _ = gaussian_classes(n=500, dim=8)
  eraser = erasure.random_eraser(x_NxD, rank, seed=1)
  assert eraser.rank == rank
  assert np.linalg.matrix_rank(eraser.matrix_DxD) == 8 - rank
  once = eraser.apply(x_NxD)
  np.testing.assert_allclose(eraser.apply(once), once, atol=1e-10)
  np.testing.assert_allclose(once.mean(0), x_NxD.mean(0), atol=1e-10)  # centred on the mean
  other = erasure.random_eraser(x_NxD, rank, seed=2)
  assert rank == 0 or not np.allclose(other.matrix_DxD, eraser.matrix_DxD)
  with pytest.raises(ValueError, match="rank must be in 0..8"):
    erasure.random_eraser(x_NxD, 9)
