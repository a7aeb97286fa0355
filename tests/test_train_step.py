"""The train step's maths, checked directly: the update is that of sum(loss) / sum(weight)
(gradient accumulation included), grad_norm is that gradient's norm, a non-finite batch
changes nothing; and in the loop a step is one optimizer update over k micro-batches."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import train_helpers as th
from jaxencoder.tasks.base import Family, Task
from jaxencoder.train import steps
from jaxencoder.train.init_from import finalized
from jaxencoder.train.loop import train_and_evaluate
from jaxencoder.train.datasets import make_pipelines
from jaxencoder.train.metrics import read_metrics
from jaxencoder.train.optim import learning_rate_schedule

D, C = 3, 2  # toy features, outputs


def toy_task() -> Task:
  """A weighted squared error of a linear map: rows weigh `w` (like masked-token counts)."""
  def loss_fn(params, batch, rng, train):
    del rng, train
    err_B = jnp.sum((batch["x"] @ params["w"] + params["b"][None] - batch["y"]) ** 2, -1)
    sums = {"loss_sum": jnp.sum(err_B * batch["w"]), "loss_weight": jnp.sum(batch["w"])}
    return sums["loss_sum"] / sums["loss_weight"], sums
  return Task("toy", nn.Dense(C), "x", loss_fn, Family())


def toy_batch(rows: int, seed: int, weights=None):
  rng = np.random.default_rng(seed)
  w = np.asarray(weights if weights is not None else rng.integers(1, 5, rows), np.float32)
  return {"x": jnp.asarray(rng.standard_normal((rows, D)), jnp.float32),
          "y": jnp.asarray(rng.standard_normal((rows, C)), jnp.float32), "w": jnp.asarray(w)}


def toy_params(seed: int = 0):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(rng.standard_normal((D, C)), jnp.float32),
          "b": jnp.asarray(rng.standard_normal(C), jnp.float32)}


def reference_loss(params, batch):
  """sum(loss) / sum(weight), written out independently of the task's sums."""
  err_B = jnp.sum((batch["x"] @ params["w"] + params["b"][None] - batch["y"]) ** 2, -1)
  return jnp.sum(err_B * batch["w"]) / jnp.sum(batch["w"])


def new_state(params, tx):
  return steps.TrainState(jnp.zeros((), jnp.int32), params, tx.init(params),
                          jnp.full((), -1, jnp.int32))


def run_step(tx, state, batch, micro_batches=1):
  step = jax.jit(lambda s, b: steps.train_step(s, b, task=toy_task(), tx=tx,
                                               base_rng=jax.random.key(0),
                                               micro_batches=micro_batches))
  return step(state, batch)


@pytest.mark.parametrize("micro_batches", [1, 2, 4])
def test_sgd_update_is_minus_the_gradient_of_summed_loss_over_summed_weight(micro_batches):
  params, batch = toy_params(), toy_batch(8, seed=1)
  tx = optax.sgd(1.0)
  state, metrics = run_step(tx, new_state(params, tx), batch, micro_batches)
  grads = jax.grad(reference_loss)(params, batch)
  jax.tree.map(lambda new, p, g: np.testing.assert_allclose(new, p - g, rtol=1e-5, atol=1e-6),
               state.params, params, grads)
  np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(grads), rtol=1e-5)
  np.testing.assert_allclose(metrics["loss"], reference_loss(params, batch), rtol=1e-5)
  assert float(metrics["loss_weight"]) == float(np.sum(batch["w"]))  # sums over all rows
  assert int(state.step) == 1


def test_frozen_leaves_stay_out_of_grad_norm_and_their_gradients_are_never_computed():
  """With `trainable` (w frozen): grad_norm is b's gradient norm, the update is the one
  without it, and the compiled step does fewer FLOPs (XLA drops w's gradient)."""
  from jaxencoder.train.optim import make_optimizer, trainable_mask
  params, batch = toy_params(), toy_batch(8, seed=1)
  tx, _ = make_optimizer({"name": "adamw", "learning_rate": 0.1, "warmup_steps": 0,
                          "schedule": "constant", "grad_clip_norm": 0.0, "weight_decay": 0.0,
                          "freeze": ("^w$",)}, params, num_layers=1)
  trainable = trainable_mask(params, {"freeze": ("^w$",)})
  assert trainable == {"w": False, "b": True}
  step = lambda mask: jax.jit(lambda s, b: steps.train_step(
      s, b, task=toy_task(), tx=tx, base_rng=jax.random.key(0), trainable=mask))
  state, metrics = step(trainable)(new_state(params, tx), batch)
  unmasked, _ = step(None)(new_state(params, tx), batch)
  grads = jax.grad(reference_loss)(params, batch)
  np.testing.assert_allclose(metrics["grad_norm"], np.linalg.norm(grads["b"]), rtol=1e-5)
  np.testing.assert_array_equal(state.params["w"], params["w"])
  np.testing.assert_array_equal(state.params["b"], unmasked.params["b"])
  assert not np.allclose(state.params["b"], params["b"])
  flops = [step(mask).lower(new_state(params, tx), batch).compile().cost_analysis()["flops"]
           for mask in (None, trainable)]
  assert flops[1] < flops[0]


def test_micro_batches_with_different_weights_give_the_big_batch_update():
  """Two micro-batches (rows 0, 2, 4, .. and 1, 3, 5, ..) of total weight 4 and 24 under
  AdamW for 3 steps: the params the 8-row batch gives, not a mean of the two means."""
  weights = [1, 5, 1, 5, 1, 7, 1, 7]
  batches = [toy_batch(8, seed=s, weights=weights) for s in range(3)]
  tx = optax.adamw(0.1, weight_decay=0.01)
  one, two = new_state(toy_params(), tx), new_state(toy_params(), tx)
  for batch in batches:
    one, m_one = run_step(tx, one, batch, 1)
    two, m_two = run_step(tx, two, batch, 2)
    np.testing.assert_allclose(m_two["loss"], m_one["loss"], rtol=1e-6)
    np.testing.assert_allclose(m_two["grad_norm"], m_one["grad_norm"], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               two.params, one.params)
  # The test can tell: the mean of the micro-batch means is another gradient here.
  halves = [jax.tree.map(lambda x: x[j::2], batches[0]) for j in (0, 1)]
  mean_of_means = jax.tree.map(lambda a, b: (a + b) / 2,
                               *(jax.grad(reference_loss)(toy_params(), h) for h in halves))
  exact = jax.grad(reference_loss)(toy_params(), batches[0])
  assert not np.allclose(mean_of_means["w"], exact["w"], rtol=1e-2)


def noisy_task() -> Task:
  """The toy loss times a random factor drawn from the step's rng, as dropout draws masks."""
  toy = toy_task()
  def loss_fn(params, batch, rng, train):
    _, sums = toy.loss_fn(params, batch, rng, train)
    sums = {**sums, "loss_sum": sums["loss_sum"] * (1.0 + jax.random.uniform(rng))}
    return sums["loss_sum"] / sums["loss_weight"], sums
  return Task("noisy", nn.Dense(C), "x", loss_fn, Family())


def test_micro_batch_j_draws_its_own_randomness():
  """Identical micro-batches under fold_in(rng, j): the sums are those of each drawn alone,
  so no two micro-batches share a dropout mask."""
  half = toy_batch(4, seed=5)
  twice = jax.tree.map(lambda x: jnp.repeat(x, 2, axis=0), half)  # rows j::2 are `half`
  rng = jax.random.key(7)
  grads, sums = steps.summed_gradients(noisy_task(), toy_params(), twice, rng, micro_batches=2)
  alone = [steps.summed_gradients(noisy_task(), toy_params(), half, jax.random.fold_in(rng, j))
           for j in range(2)]
  np.testing.assert_allclose(sums["loss_sum"], alone[0][1]["loss_sum"] + alone[1][1]["loss_sum"],
                             rtol=1e-6)
  jax.tree.map(lambda g, a, b: np.testing.assert_allclose(g, a + b, rtol=1e-5, atol=1e-6),
               grads, alone[0][0], alone[1][0])
  assert abs(float(alone[0][1]["loss_sum"] - alone[1][1]["loss_sum"])) > 1e-3  # draws differ


def test_a_batch_that_does_not_split_into_micro_batches_names_both_counts():
  tx = optax.sgd(1.0)
  with pytest.raises(ValueError, match="a batch of 6 rows does not split into 4 micro-batches"):
    run_step(tx, new_state(toy_params(), tx), toy_batch(6, seed=0), 4)


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_a_nan_batch_leaves_params_and_optimizer_state_bit_identical(micro_batches):
  tx = optax.adam(0.1)
  state, _ = run_step(tx, new_state(toy_params(), tx), toy_batch(4, seed=0))  # Adam moments != 0
  bad = toy_batch(4, seed=1)
  bad["x"] = bad["x"].at[3, 1].set(jnp.nan)
  after, metrics = run_step(tx, state, bad, micro_batches)
  assert not np.isfinite(float(metrics["loss"]))
  jax.tree.map(np.testing.assert_array_equal, (after.params, after.opt_state),
               (state.params, state.opt_state))
  assert int(after.step) == 2 and int(after.nonfinite_step) == 1
  later, _ = run_step(tx, after, toy_batch(4, seed=2), micro_batches)  # and stays frozen
  jax.tree.map(np.testing.assert_array_equal, later.params, state.params)


# ------------------------------------------------------------------ in the loop
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("corpus")
  return root, th.text_corpus(root), th.write_vocab(root)


def accumulating_config(corpus, batch_size: int, grad_accum_steps: int):
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab, dropout_rate=0.0, attention_dropout_rate=0.0)
  config.batch_size, config.optim.grad_accum_steps = batch_size, grad_accum_steps
  config.num_train_steps, config.log_every, config.eval_every = 4, 1, 4
  config.checkpoint_every = 2
  config.optim.schedule, config.optim.warmup_steps = "linear", 1
  config.optim.learning_rate = 3e-2  # large enough that a wrongly scheduled step shows
  return config


def test_pipeline_rows_per_step_follow_grad_accum_steps(corpus):
  config = finalized(accumulating_config(corpus, batch_size=4, grad_accum_steps=3))
  batch = next(iter(make_pipelines(config).train))
  assert batch["input_ids"].shape[0] == 12


@pytest.mark.slow
def test_grad_accumulation_in_the_loop_equals_the_doubled_batch(corpus, tmp_path):
  """k = 2 micro-batches of 4 rows vs one batch of 8 (dropout off), 4 steps: the same
  losses, logged LRs and final params; steps, logs and checkpoints count updates, and the
  logged LR is the schedule's at the update applied (0 at the warmup's first)."""
  for name, (batch_size, k) in {"accumulated": (4, 2), "doubled": (8, 1)}.items():
    train_and_evaluate(accumulating_config(corpus, batch_size, k), tmp_path / name)
  rows = {name: [r for r in read_metrics(tmp_path / name) if r["split"] == "train"]
          for name in ("accumulated", "doubled")}
  assert [r["step"] for r in rows["accumulated"]] == [1, 2, 3, 4]
  schedule = learning_rate_schedule(finalized(accumulating_config(corpus, 4, 2)).optim)
  expected_lr = [float(schedule(step - 1)) for step in (1, 2, 3, 4)]
  assert expected_lr[0] == 0.0 and len(set(expected_lr)) == 4
  for name in rows:
    np.testing.assert_allclose([r["learning_rate"] for r in rows[name]], expected_lr, rtol=1e-6)
  np.testing.assert_allclose([r["loss"] for r in rows["accumulated"]],
                             [r["loss"] for r in rows["doubled"]], rtol=1e-5)
  a, b = (th.final_params(accumulating_config(corpus, *bk), tmp_path / name)
          for name, bk in (("accumulated", (4, 2)), ("doubled", (8, 1))))
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=2e-5, atol=2e-6), a, b)
  checkpoints = sorted(int(p.name) for p in (tmp_path / "accumulated" / "checkpoints").iterdir()
                       if p.name.isdigit())
  assert checkpoints == [2, 4]
