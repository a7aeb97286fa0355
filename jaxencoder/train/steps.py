"""Train state, sharded initialisation and the pure train / eval steps."""

from __future__ import annotations

import contextlib
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxencoder.train import sharding as sharding_lib
from jaxencoder.tasks.base import Task


@flax.struct.dataclass
class TrainState:
  """Everything a step changes. `nonfinite_step` is -1 until a loss or gradient is NaN/Inf;
  from then on updates are skipped, so the state never holds non-finite values."""
  step: jax.Array
  params: Any
  opt_state: Any
  nonfinite_step: jax.Array


@contextlib.contextmanager
def mesh_context(mesh: Mesh, rules):
  """Activates the mesh and logical rules so activation constraints take effect."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def _boxed_params(task: Task, example_batch, rng):
  return task.model.init(rng, *task.example_batch(example_batch))["params"]


def boxed_param_shapes(task: Task, example_batch):
  """ShapeDtypeStructs of the task model's params, boxed with their logical axes. One
  trace of the model's init (BERT-base: 0.5 s scanned, 1.5-2 s unrolled on 2 CPU
  cores); the functions below take it as `boxed=` instead of tracing again."""
  return jax.eval_shape(lambda rng: _boxed_params(task, example_batch, rng),
                        jax.random.key(0))


def param_shapes(task: Task, example_batch, *, boxed=None):
  """Unboxed ShapeDtypeStructs of the task model's params (no computation)."""
  return nn.meta.unbox(boxed_param_shapes(task, example_batch) if boxed is None else boxed)


def _state_init_fn(task: Task, tx, example_batch):
  def init(rng) -> TrainState:
    params = nn.meta.unbox(_boxed_params(task, example_batch, rng))
    return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params),
                      jnp.full((), -1, jnp.int32))
  return init


def state_shardings(task: Task, tx, example_batch, mesh: Mesh, rules, *,
                    boxed=None) -> TrainState:
  """Shardings for every leaf of the train state, from logical axis names."""
  if boxed is None:
    boxed = boxed_param_shapes(task, example_batch)
  param_shardings = sharding_lib.logical_shardings(boxed, mesh, rules)
  opt_shapes = jax.eval_shape(tx.init, nn.meta.unbox(boxed))
  opt_shardings = sharding_lib.optimizer_shardings(tx, opt_shapes, param_shardings, mesh)
  replicated = NamedSharding(mesh, P())
  return TrainState(replicated, param_shardings, opt_shardings, replicated)


def init_state(task: Task, tx, example_batch, rng, mesh: Mesh, rules, *,
               shardings: TrainState | None = None) -> TrainState:
  """Creates params and optimizer state directly in their shardings (no host copy)."""
  if shardings is None:
    shardings = state_shardings(task, tx, example_batch, mesh, rules)
  init = _state_init_fn(task, tx, example_batch)
  # No mesh context here: DenseGeneral initialises kernels flat, and the logical
  # constraint on unboxing would not match; out_shardings place the result.
  return jax.jit(init, out_shardings=shardings)(rng)


def abstract_state(task: Task, tx, example_batch, mesh: Mesh, rules, *,
                   shardings: TrainState | None = None, boxed=None) -> TrainState:
  """ShapeDtypeStructs with shardings: the target for restoring a checkpoint."""
  if boxed is None:
    boxed = boxed_param_shapes(task, example_batch)
  if shardings is None:
    shardings = state_shardings(task, tx, example_batch, mesh, rules, boxed=boxed)
  params = nn.meta.unbox(boxed)
  scalar = jax.ShapeDtypeStruct((), jnp.int32)
  shapes = TrainState(scalar, params, jax.eval_shape(tx.init, params), scalar)
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                      shapes, shardings)


def split_micro_batches(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
  """[k * B, ...] -> [k, B, ...]: micro-batch j holds rows j, j + k, j + 2k, ... so each
  device's contiguous block of rows splits into k local pieces (no data moves)."""
  def split(x):
    if x.shape[0] % k:
      raise ValueError(f"a batch of {x.shape[0]} rows does not split into {k} micro-batches")
    return jnp.swapaxes(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def merge_micro_batches(micro, k: int):
  """split_micro_batches undone: [k, B, ...] -> [k * B, ...] in the batch's row order."""
  return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(k * x.shape[1], *x.shape[2:]),
                      micro)


def summed_gradients(task: Task, params, batch: dict[str, jax.Array], rng, *,
                     micro_batches: int = 1):
  """(gradients of sum(loss), metric sums) over the batch; with k micro-batches, the k
  sums of a scan over them (one micro-batch's activations live at a time), micro-batch j
  drawing its dropout from fold_in(rng, j). A task with a loss on the whole batch's
  embeddings (Task.embed_fn) takes cached_gradients instead: the loss of one batch."""
  if micro_batches > 1 and task.embed_fn is not None:
    return cached_gradients(task, params, batch, rng, micro_batches=micro_batches)

  def loss_sum(params, batch, rng):
    _, sums = task.loss_fn(params, batch, rng, True)
    return sums["loss_sum"], sums

  grad_fn = jax.value_and_grad(loss_sum, has_aux=True)
  if micro_batches == 1:
    (_, sums), grads = grad_fn(params, batch, rng)
    return grads, sums

  def accumulate(carry, micro):
    j, micro_batch = micro
    (_, sums), grads = grad_fn(params, micro_batch, jax.random.fold_in(rng, j))
    return jax.tree.map(jnp.add, carry, (grads, sums)), None

  micro = (jnp.arange(micro_batches), split_micro_batches(batch, micro_batches))
  first_batch = jax.tree.map(lambda x: x[0], micro[1])
  (_, sums_shape), grads_shape = jax.eval_shape(grad_fn, params, first_batch, rng)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (grads_shape, sums_shape))
  (grads, sums), _ = jax.lax.scan(accumulate, zeros, micro)
  return grads, sums


def cached_gradients(task: Task, params, batch: dict[str, jax.Array], rng, *,
                     micro_batches: int):
  """summed_gradients of a loss on embeddings (contrastive: in-batch negatives) over the
  whole batch of k micro-batches, at one micro-batch's activation memory: GradCache (Gao et
  al. 2021). (1) each micro-batch embedded without gradients; (2) the loss of all the
  embeddings and its gradient with respect to them; (3) each micro-batch embedded again
  and backpropagated with its embeddings' gradient (a vjp), parameter gradients summed.
  Micro-batch j draws its dropout from fold_in(rng, j) in (1) and (3) alike, so (3)
  recomputes exactly the embeddings (2) saw. Metric sums are the whole batch's."""
  micro = (jnp.arange(micro_batches), split_micro_batches(batch, micro_batches))
  embed = lambda params, j, micro_batch: task.embed_fn(
      params, micro_batch, jax.random.fold_in(rng, j), True)
  embeddings = merge_micro_batches(jax.lax.map(lambda xs: embed(params, *xs), micro),
                                   micro_batches)

  def loss_sum(embeddings):
    _, sums = task.embedding_loss_fn(embeddings, batch)
    return sums["loss_sum"], sums

  (_, sums), d_embeddings = jax.value_and_grad(loss_sum, has_aux=True)(embeddings)

  def backward(grads, xs):
    j, micro_batch, d_micro = xs
    _, vjp = jax.vjp(lambda p: embed(p, j, micro_batch), params)
    return jax.tree.map(jnp.add, grads, vjp(d_micro)[0]), None

  zeros = jax.tree.map(jnp.zeros_like, params)
  grads, _ = jax.lax.scan(backward, zeros,
                          (*micro, split_micro_batches(d_embeddings, micro_batches)))
  return grads, sums


def train_step(state: TrainState, batch: dict[str, jax.Array], *, task: Task,
               tx: optax.GradientTransformation, base_rng: jax.Array,
               axis_name: str | None = None, micro_batches: int = 1, trainable=None):
  """One optimizer step. Returns (new state, metric sums incl. grad_norm and loss).

  Gradients are those of sum(loss) / sum(weight) over the whole batch: with
  `micro_batches=k` (optim.grad_accum_steps) the batch of k x B rows runs as k
  micro-batches whose summed losses and weights are divided once, so the update is the
  one a single batch of k x B rows makes (a loss on the whole batch's embeddings, as
  contrastive in-batch negatives: cached_gradients). `axis_name` (pmap compatibility, see
  train/parallel.py) psums each device's gradient and metric sums first, so the update
  equals the jit path's for the same global batch. `trainable` (optim.trainable_mask of
  the params; None: all) keeps frozen leaves out of grad_norm, which is then the norm the
  optimizer clips, and XLA never computes their gradients (frozen kernels under LoRA or
  freeze_encoder cost no weight-gradient matmuls).
  """
  rng = jax.random.fold_in(base_rng, state.step)
  grads, sums = summed_gradients(task, state.params, batch, rng, micro_batches=micro_batches)
  if axis_name is not None:
    grads, sums = jax.lax.psum((grads, sums), axis_name)
  weight = jnp.maximum(sums["loss_weight"], 1.0)
  grads = jax.tree.map(lambda g: g / weight, grads)
  loss = sums["loss_sum"] / weight
  grad_norm = optax.tree.norm(grads if trainable is None else trainable_only(grads, trainable))
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm) & (state.nonfinite_step < 0)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  new_state = TrainState(
      step=state.step + 1,
      params=keep(params, state.params),
      opt_state=keep(opt_state, state.opt_state),
      nonfinite_step=jnp.where((state.nonfinite_step < 0) & ~finite, state.step,
                               state.nonfinite_step))
  return new_state, {**sums, "grad_norm": grad_norm, "loss": loss}


def trainable_only(grads, trainable):
  """`grads` with every wholly frozen leaf a scalar zero (nothing of it is used)."""
  return jax.tree.map(lambda g, t: g if np.any(t) else jnp.zeros((), g.dtype), grads, trainable)


def eval_step(params, batch: dict[str, jax.Array], *, task: Task):
  """Metric sums for one batch, deterministic."""
  _, sums = task.loss_fn(params, batch, jax.random.key(0), False)
  return sums


def jit_train_step(task: Task, tx, base_rng, shardings: TrainState, mesh: Mesh, *,
                   micro_batches: int = 1, trainable=None):
  """train_step jitted with explicit in/out shardings and the state donated."""
  step = lambda state, batch: train_step(state, batch, task=task, tx=tx, base_rng=base_rng,
                                         micro_batches=micro_batches, trainable=trainable)
  batch_sharding = sharding_lib.batch_sharding(mesh)
  return jax.jit(step, in_shardings=(shardings, batch_sharding),
                 out_shardings=(shardings, None), donate_argnums=0)


def jit_eval_step(task: Task, shardings: TrainState, mesh: Mesh):
  step = lambda params, batch: eval_step(params, batch, task=task)
  return jax.jit(step, in_shardings=(shardings.params, sharding_lib.batch_sharding(mesh)))
