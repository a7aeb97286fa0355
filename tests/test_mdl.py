"""MDL probing (online code, jaxencoder.probing.mdl): code lengths computed by hand on a
toy problem, and a real linear probe compressing labels that the features carry more
than a control task."""

import numpy as np
import pytest

from jaxencoder.probing import mdl
from jaxencoder.probing.probes import ProbeConfig, control_labels, split_items


def counting_fit(num_classes):
  """A 'probe' that ignores x: add-one smoothed label frequencies of its training items."""
  def fit(x_train, y_train):
    counts_K = np.bincount(y_train, minlength=num_classes) + 1.0
    log_p_K = np.log(counts_K / counts_K.sum())
    return lambda x: np.tile(log_p_K, (len(x), 1))
  return fit


def test_block_ends_are_increasing_and_end_at_n():
  assert mdl.block_ends(8, (0.25, 0.5, 1.0)) == [2, 4, 8]
  assert mdl.block_ends(5, mdl.FRACTIONS) == [1, 2, 5]  # rounding merges tiny blocks
  assert mdl.block_ends(1000)[:3] == [1, 2, 4]


def test_online_code_lengths_by_hand():
  y = np.array([0, 0, 0, 1, 0, 0, 1, 0])
  code = mdl.online_code(np.zeros((8, 1)), y, 2, counting_fit(2), fractions=(0.25, 0.5, 1.0))
  # Block 1: items 0-1, uniform: 2 x 1 bit.
  # Block 2: items 2-3 (y 0, 1) with counts of items 0-1 {0: 2, 1: 0} + 1: p = 3/4, 1/4.
  # Block 3: items 4-7 (y 0, 0, 1, 0) with counts of items 0-3 {0: 3, 1: 1} + 1: 4/6, 2/6.
  by_hand = [2.0, -np.log2(3 / 4) - np.log2(1 / 4), -3 * np.log2(4 / 6) - np.log2(2 / 6)]
  assert [b["end"] for b in code["blocks"]] == [2, 4, 8]
  np.testing.assert_allclose([b["bits"] for b in code["blocks"]], by_hand, rtol=1e-12)
  assert code["online_bits"] == pytest.approx(sum(by_hand), rel=1e-12)
  assert code["uniform_bits"] == 8.0
  assert code["compression"] == pytest.approx(8.0 / sum(by_hand), rel=1e-12)


def test_the_uniform_code_uses_log2_of_the_classes():
  code = mdl.online_code(np.zeros((10, 1)), np.arange(10) % 5, 5, counting_fit(5),
                         fractions=(0.5, 1.0))
  assert code["uniform_bits"] == pytest.approx(10 * np.log2(5))
  assert code["blocks"][0]["bits"] == pytest.approx(5 * np.log2(5))


def test_a_layer_that_holds_its_labels_compresses_them_better_than_a_control_task():
  rng = np.random.default_rng(0)
  sentences, per = 120, 5
  sentence_ids = np.repeat(np.arange(sentences), per)
  words = rng.integers(0, 40, size=sentences * per)
  labels = words % 3  # a word's label is a function of it ...
  centers_Kx16 = 2.0 * rng.normal(size=(3, 16))
  x = centers_Kx16[labels] + rng.normal(size=(len(words), 16))  # ... and the features hold it
  types = [f"w{w}" for w in words]
  control = control_labels(types, labels, 3, seed=0)  # a random label per word
  splits = split_items(sentence_ids, seed=0)
  cfg = ProbeConfig(max_epochs=30, patience=3)
  out = mdl.mdl_layer(x, labels, sentence_ids, splits, 3, cfg, control_M=control)
  assert out["uniform_bits"] == pytest.approx(len(splits["train"]) * np.log2(3))
  assert out["compression"] > 1.5
  assert out["online_bits"] < out["uniform_bits"]
  # Random features of the same words: the labels compress no better than uniform.
  noise = rng.normal(size=x.shape)
  plain = mdl.mdl_layer(noise, labels, sentence_ids, splits, 3, cfg)
  assert plain["compression"] < 1.1 < out["compression"]
  assert set(out) >= {"control_online_bits", "control_uniform_bits", "control_compression"}


def test_fewer_than_two_items_are_refused():
  with pytest.raises(ValueError, match="at least 2 items, got 1"):
    mdl.online_code(np.zeros((1, 1)), np.array([0]), 2, counting_fit(2))
