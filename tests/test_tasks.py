"""Task losses: the cross-entropy sums, and MLM's gathered path against full logits."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import fast_first, random_ids, tiny_config
from jaxencoder.tasks import base, classification, registry


def test_weighted_ce_matches_optax_and_argmax():
  logits = jax.random.normal(jax.random.key(0), (3, 5, 11)) * 3
  labels = jax.random.randint(jax.random.key(1), (3, 5), 0, 11)
  weights = jax.random.uniform(jax.random.key(2), (3, 5))
  sums = base.weighted_ce(logits, labels, weights)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  np.testing.assert_allclose(sums["loss_sum"], jnp.sum(ce * weights), rtol=1e-6)
  np.testing.assert_allclose(sums["correct"], jnp.sum(correct * weights), rtol=1e-6)
  np.testing.assert_allclose(sums["loss_weight"], jnp.sum(weights), rtol=1e-6)
  grad = jax.grad(lambda x: base.weighted_ce(x, labels, weights)["loss_sum"])(logits)
  ref = jax.grad(lambda x: jnp.sum(optax.softmax_cross_entropy_with_integer_labels(x, labels)
                                   * weights))(logits)
  np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scan_layers", fast_first([False, True]))
def test_mlm_at_masked_positions_equals_full_logits_loss_and_gradients(scan_layers):
  cfg = tiny_config(scan_layers=scan_layers)
  ids = random_ids(0, (3, 12))
  weights = (jax.random.uniform(jax.random.key(1), (3, 12)) < 0.3).astype(jnp.float32)
  weights = weights.at[:, 5].set(1.0)  # at least one masked position per row
  batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids).at[2, 9:].set(0),
           "mlm_labels": random_ids(2, (3, 12)), "mlm_weights": weights}
  full = registry.make_task("mlm", cfg, max_predictions=0)
  gathered = registry.make_task("mlm", cfg, max_predictions=12)
  params = nn.meta.unbox(full.model.init(jax.random.key(0), *full.example_batch(batch))["params"])
  grad = lambda task: jax.jit(jax.grad(
      lambda p: task.loss_fn(p, batch, jax.random.key(0), False), has_aux=True))(params)
  full_grads, full_sums = grad(full)
  grads, sums = grad(gathered)
  for key in ("loss_sum", "loss_weight", "correct"):
    np.testing.assert_allclose(sums[key], full_sums[key], rtol=1e-5)
  assert float(sums["dropped"]) == 0.0
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
               grads, full_grads)


def test_macro_f1_counts_a_predicted_class_that_gold_lacks():
  """gold 0 0 1 1 / pred 0 2 1 1: class 2 (never gold) is predicted once: its F1 of 0
  is averaged in (as scikit-learn's macro F1); F1 = 2/3, 1, 0."""
  gold, pred = jnp.array([0, 0, 1, 1]), jnp.array([0, 2, 1, 1])
  sums = {**base.weighted_ce(jax.nn.one_hot(pred, 3) * 5.0, gold, jnp.ones(4)),
          **classification.confusion(jax.nn.one_hot(pred, 3) * 5.0, gold, jnp.ones(4), 3)}
  assert classification.FAMILY.summarize("classify", sums)["f1_macro"] == pytest.approx((2 / 3 + 1.0 + 0.0) / 3, rel=1e-6)
  # A class neither in gold nor predicted is left out of the average.
  sums = {**base.weighted_ce(jax.nn.one_hot(pred, 4) * 5.0, gold, jnp.ones(4)),
          **classification.confusion(jax.nn.one_hot(pred, 4) * 5.0, gold, jnp.ones(4), 4)}
  assert classification.FAMILY.summarize("classify", sums)["f1_macro"] == pytest.approx((2 / 3 + 1.0 + 0.0) / 3, rel=1e-6)


def test_macro_f1_and_accuracy_of_a_hand_built_confusion_matrix():
  """gold 0 0 0 0 1 1 1 2 2 2 / pred 0 0 1 2 1 1 0 2 2 1 (+ one weight-0 row):
  per class (tp, fp, fn) = (2, 1, 2), (2, 2, 1), (2, 1, 1); F1 = 4/7, 4/7, 4/6."""
  gold = jnp.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2, 2])
  pred = jnp.array([0, 0, 1, 2, 1, 1, 0, 2, 2, 1, 0])
  weights = jnp.array([1.0] * 10 + [0.0])  # a padding row counts nowhere
  logits = jax.nn.one_hot(pred, 3) * 5.0
  sums = {**base.weighted_ce(logits, gold, weights),
          **classification.confusion(logits, gold, weights, 3)}
  np.testing.assert_array_equal(sums["tp"], [2, 2, 2])
  np.testing.assert_array_equal(sums["fp"], [1, 2, 1])
  np.testing.assert_array_equal(sums["fn"], [2, 1, 1])
  metrics = classification.FAMILY.summarize("classify", sums)
  assert metrics["accuracy"] == pytest.approx(6 / 10)
  assert metrics["f1_macro"] == pytest.approx((4 / 7 + 4 / 7 + 4 / 6) / 3, rel=1e-6)
  # Sums over two halves of the batch summarise to the same values (eval over a split).
  halves = [{**base.weighted_ce(logits[s], gold[s], weights[s]),
             **classification.confusion(logits[s], gold[s], weights[s], 3)}
            for s in (slice(0, 5), slice(5, None))]
  total = jax.tree.map(lambda a, b: a + b, *halves)
  assert classification.FAMILY.summarize("classify", total) == pytest.approx(metrics)


def test_mlm_drops_masked_tokens_beyond_max_predictions_and_counts_them():
  """Rows with 5 and 1 masked tokens, max_predictions 2: the first 2 (and the 1) are
  predicted, 3 are dropped; the loss is the full-logits loss at exactly those positions."""
  cfg = tiny_config()
  ids = random_ids(0, (2, 12))
  weights = jnp.zeros((2, 12)).at[0, jnp.array([1, 3, 4, 8, 10])].set(1.0).at[1, 6].set(1.0)
  batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids),
           "mlm_labels": random_ids(2, (2, 12)), "mlm_weights": weights}
  gathered = registry.make_task("mlm", cfg, max_predictions=2)
  full = registry.make_task("mlm", cfg, max_predictions=0)
  params = nn.meta.unbox(full.model.init(jax.random.key(0), *full.example_batch(batch))["params"])
  _, sums = jax.jit(lambda p: gathered.loss_fn(p, batch, jax.random.key(0), False))(params)
  kept = jnp.zeros((2, 12)).at[0, jnp.array([1, 3])].set(1.0).at[1, 6].set(1.0)
  _, expected = full.loss_fn(params, {**batch, "mlm_weights": kept}, jax.random.key(0), False)
  assert float(sums["dropped"]) == 3.0 and float(sums["loss_weight"]) == 3.0
  np.testing.assert_allclose(sums["loss_sum"], expected["loss_sum"], rtol=1e-5)
  assert gathered.summarize(sums)["dropped_predictions"] == 3.0
