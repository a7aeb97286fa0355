"""GradCache (steps.cached_gradients): a contrastive task trained as k micro-batches makes
the update of one batch of k x B rows (in-batch negatives over the whole batch), with the
whole batch's metrics; dropout draws match between the no-gradient pass and the backward
pass; tasks without embeddings keep summed micro-batch gradients."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import fast_first, random_ids, tiny_config
from jaxencoder.tasks import matryoshka, registry
from jaxencoder.train import steps

K = 4  # micro-batches
ROWS = 8  # rows of the whole batch


def contrastive_task(dropout: float = 0.0, **options):
  cfg = tiny_config(num_layers=1, dropout_rate=dropout)
  return registry.make_task(options.pop("name", "contrastive"), cfg, projection_dim=16,
                            **options)


def grouped_batch(group: int = 3, seed: int = 0, scored: bool = False):
  ids = random_ids(seed, (ROWS, group, 6))
  batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids),
           "example_weights": jnp.ones(ROWS).at[5].set(0.0)}  # a padding row counts nowhere
  if scored:
    batch["targets"] = jax.random.uniform(jax.random.key(seed), (ROWS,)) * 5
  return batch


def init(task, batch):
  params = jax.jit(task.model.init)(jax.random.key(0), *task.example_batch(batch))["params"]
  return nn.meta.unbox(params)


def gradients(task, params, batch, micro_batches, rng=jax.random.key(3)):
  fn = lambda p, b: steps.summed_gradients(task, p, b, rng, micro_batches=micro_batches)
  return jax.jit(fn)(params, batch)


def assert_same(got, want, rel=1e-5):
  """Equal within float32 round-off: to `rel` of the largest entry of `want`'s leaves (the
  sums over a batch differ in order; measured ~5e-7)."""
  scale = max(float(np.abs(w).max()) for w in jax.tree.leaves(want))
  jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=0, atol=rel * scale),
               got, want)


CASES = {  # task options and batch: each a loss on the whole batch's embeddings
    "hard_negatives": ({}, dict(group=3)),
    "symmetric": (dict(symmetric=True), dict(group=2)),
    "matryoshka": (dict(prefixes=matryoshka.Prefixes((16, 8, 4), (1.0, 0.5, 0.0))),
                   dict(group=3)),
    "cosent": (dict(name="contrastive_cosent"), dict(group=2, scored=True)),
    "simcse": ({}, dict(group=1)),
}


@pytest.mark.parametrize("case", fast_first(list(CASES)))
def test_k_micro_batches_give_the_gradients_and_metrics_of_one_batch(case):
  options, batch_options = CASES[case]
  task = contrastive_task(**options)
  batch = grouped_batch(**batch_options)
  if batch_options["group"] == 1:  # SimCSE: single texts [B, L]
    batch = {k: v[:, 0] if v.ndim == 3 else v for k, v in batch.items()}
  params = init(task, batch)
  (one_grads, one_sums), (k_grads, k_sums) = (gradients(task, params, batch, k) for k in (1, K))
  assert_same(k_grads, one_grads)
  assert k_sums.keys() == one_sums.keys()
  for key in k_sums:
    np.testing.assert_allclose(k_sums[key], one_sums[key], rtol=1e-5, atol=1e-6)
  assert float(optax.tree.norm(one_grads)) > 1e-3  # something to compare


@pytest.mark.slow
def test_summed_micro_batch_losses_would_differ():
  """What GradCache fixes: the mean of per-micro-batch InfoNCE (negatives within each
  micro-batch) is another loss than the whole batch's."""
  task, batch = contrastive_task(), grouped_batch()
  params = init(task, batch)
  _, whole = gradients(task, params, batch, 1)
  per_micro = jax.jit(lambda p: [task.loss_fn(p, jax.tree.map(lambda x: x[j::K], batch),
                                               None, False)[1]["loss_sum"] for j in range(K)])
  assert abs(sum(map(float, per_micro(params))) - float(whole["loss_sum"])) > 0.1


def test_dropout_in_the_backward_pass_matches_the_cached_embeddings():
  """With dropout on: the gradient of the whole-batch loss of micro-batch j's embeddings
  under fold_in(rng, j), taken directly (its activations all live at once)."""
  task, batch = contrastive_task(dropout=0.3), grouped_batch()
  params, rng = init(task, batch), jax.random.key(11)

  def direct(params):
    micro = steps.split_micro_batches(batch, K)
    z = [task.embed_fn(params, jax.tree.map(lambda x: x[j], micro), jax.random.fold_in(rng, j),
                       True) for j in range(K)]
    _, sums = task.embedding_loss_fn(steps.merge_micro_batches(jnp.stack(z), K), batch)
    return sums["loss_sum"], sums

  (_, want_sums), want = jax.jit(jax.value_and_grad(direct, has_aux=True))(params)
  got, got_sums = gradients(task, params, batch, K, rng)
  assert_same(got, want)
  np.testing.assert_allclose(got_sums["loss_sum"], want_sums["loss_sum"], rtol=1e-5)
  _, undropped = gradients(contrastive_task(), params, batch, K, rng)
  assert abs(float(undropped["loss_sum"] - got_sums["loss_sum"])) > 1e-3  # dropout acted


@pytest.mark.slow
def test_one_sgd_step_over_k_micro_batches_is_the_big_batch_step():
  task, batch = contrastive_task(), grouped_batch()
  params, tx = init(task, batch), optax.sgd(0.5)
  def step(micro_batches):
    state = steps.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params),
                             jnp.full((), -1, jnp.int32))
    fn = lambda s, b: steps.train_step(s, b, task=task, tx=tx, base_rng=jax.random.key(0),
                                       micro_batches=micro_batches)
    return jax.jit(fn)(state, batch)
  (one, one_metrics), (many, many_metrics) = step(1), step(K)
  assert_same(many.params, one.params)
  np.testing.assert_allclose(many_metrics["loss"], one_metrics["loss"], rtol=1e-6)
  np.testing.assert_allclose(many_metrics["grad_norm"], one_metrics["grad_norm"], rtol=1e-5)


def test_split_then_merge_is_the_batch():
  batch = {"x": jnp.arange(24).reshape(12, 2)}
  merged = steps.merge_micro_batches(steps.split_micro_batches(batch, 3), 3)
  np.testing.assert_array_equal(merged["x"], batch["x"])
