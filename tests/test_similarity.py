"""CKA (jaxencoder.probing.similarity) against direct implementations written here, and
its invariances: orthogonal maps and isotropic scaling leave it at 1, other maps do not."""

import numpy as np
import pytest

from jaxencoder.probing import similarity

RNG = np.random.default_rng(0)
X = RNG.normal(size=(60, 12))
Y = X @ RNG.normal(size=(12, 7)) + 0.5 * RNG.normal(size=(60, 7))


def direct_hsic(k, l):
  """tr(K H L H) / (n - 1)^2 with the centering matrix H spelled out."""
  n = len(k)
  h = np.eye(n) - np.ones((n, n)) / n
  return np.trace(k @ h @ l @ h) / (n - 1) ** 2


def direct_unbiased_hsic(k, l):
  """Song et al. (2012), eq. 5, term by term with explicit sums over index tuples."""
  n = len(k)
  kt, lt = k.copy(), l.copy()
  np.fill_diagonal(kt, 0)
  np.fill_diagonal(lt, 0)
  one = np.ones(n)
  term1 = np.trace(kt @ lt)
  term2 = (one @ kt @ one) * (one @ lt @ one) / ((n - 1) * (n - 2))
  term3 = 2 / (n - 2) * (one @ kt @ lt @ one)
  return (term1 + term2 - term3) / (n * (n - 3))


def direct_cka(x, y, kernel, hsic=direct_hsic):
  def k_of(z):
    if kernel == "linear":
      return z @ z.T
    d2 = ((z[:, None, :] - z[None, :, :]) ** 2).sum(-1)
    median = np.median(d2[~np.eye(len(z), dtype=bool)])
    return np.exp(-d2 / (2 * median))
  k, l = k_of(x), k_of(y)
  return hsic(k, l) / np.sqrt(hsic(k, k) * hsic(l, l))


@pytest.mark.parametrize("kernel", similarity.KERNELS)
def test_cka_equals_the_direct_formula(kernel):
  np.testing.assert_allclose(similarity.cka(X, Y, kernel), direct_cka(X, Y, kernel), rtol=1e-10)


@pytest.mark.parametrize("kernel", similarity.KERNELS)
def test_unbiased_cka_equals_song_et_als_estimator(kernel):
  want = direct_cka(X, Y, kernel, hsic=direct_unbiased_hsic)
  np.testing.assert_allclose(similarity.cka(X, Y, kernel, unbiased=True), want, rtol=1e-10)


def test_linear_cka_from_features_equals_the_kernel_form():
  k, l = similarity.gram(X), similarity.gram(Y)
  from_kernels = similarity.hsic(k, l) / np.sqrt(similarity.hsic(k, k) * similarity.hsic(l, l))
  np.testing.assert_allclose(similarity.linear_cka_features(X, Y), from_kernels, rtol=1e-10)


@pytest.mark.parametrize("kernel", similarity.KERNELS)
@pytest.mark.parametrize("unbiased", [False, True])
def test_a_representation_against_itself_is_one(kernel, unbiased):
  assert similarity.cka(X, X, kernel, unbiased=unbiased) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("kernel", similarity.KERNELS)
def test_orthogonal_maps_and_isotropic_scaling_leave_cka_at_one(kernel):
  q, _ = np.linalg.qr(RNG.normal(size=(12, 12)))
  moved = 3.7 * X @ q + 5.0  # rotation, scale and a shift (centering removes it)
  assert similarity.cka(X, moved, kernel) == pytest.approx(1.0, abs=1e-10)


def test_an_arbitrary_linear_map_changes_linear_cka():
  stretch = np.diag(np.geomspace(1, 100, 12)) @ RNG.normal(size=(12, 12))
  assert similarity.cka(X, X @ stretch) < 0.9


def test_unrelated_representations_have_low_unbiased_cka():
  noise = RNG.normal(size=(60, 200))
  biased = similarity.cka(X, noise)
  unbiased = similarity.cka(X, noise, unbiased=True)
  assert abs(unbiased) < 0.1 < biased  # the bias of wide random features at small N


def test_layer_cka_is_symmetric_with_ones_on_the_diagonal():
  layers = [X, Y, X ** 2]
  table = similarity.layer_cka(layers)
  np.testing.assert_allclose(table, table.T)
  np.testing.assert_allclose(np.diag(table), 1.0)
  np.testing.assert_allclose(table[0, 1], similarity.cka(X, Y))
  across = similarity.layer_cka(layers, layers[:2])
  assert across.shape == (3, 2)
  np.testing.assert_allclose(across, table[:, :2])


def test_representations_of_different_inputs_are_refused_naming_their_shapes():
  with pytest.raises(ValueError, match=r"same N inputs, got shapes \(60, 12\) and \(59, 7\)"):
    similarity.cka(X, Y[:59])


def test_subsampling_keeps_the_rows_paired():
  big_x = RNG.normal(size=(500, 6))
  value = similarity.cka(big_x, 2 * big_x, "rbf", max_rows=100)
  assert value == pytest.approx(1.0, abs=1e-10)
