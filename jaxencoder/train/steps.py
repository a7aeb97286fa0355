"""Train state, sharded initialisation and the pure train / eval steps."""

from __future__ import annotations

import contextlib
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
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


def train_step(state: TrainState, batch: dict[str, jax.Array], *, task: Task,
               tx: optax.GradientTransformation, base_rng: jax.Array,
               axis_name: str | None = None):
  """One optimizer step. Returns (new state, metric sums incl. grad_norm and loss).

  Gradients are those of sum(loss) / sum(weight) over the whole batch. `axis_name`
  (pmap compatibility, see train/parallel.py) psums each device's gradient and metric
  sums first, so the update equals the jit path's for the same global batch.
  """
  rng = jax.random.fold_in(base_rng, state.step)

  def loss_sum(params):
    _, sums = task.loss_fn(params, batch, rng, True)
    return sums["loss_sum"], sums

  (_, sums), grads = jax.value_and_grad(loss_sum, has_aux=True)(state.params)
  if axis_name is not None:
    grads, sums = jax.lax.psum((grads, sums), axis_name)
  weight = jnp.maximum(sums["loss_weight"], 1.0)
  grads = jax.tree.map(lambda g: g / weight, grads)
  loss = sums["loss_sum"] / weight
  grad_norm = optax.tree.norm(grads)
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


def eval_step(params, batch: dict[str, jax.Array], *, task: Task):
  """Metric sums for one batch, deterministic."""
  _, sums = task.loss_fn(params, batch, jax.random.key(0), False)
  return sums


def jit_train_step(task: Task, tx, base_rng, shardings: TrainState, mesh: Mesh):
  """train_step jitted with explicit in/out shardings and the state donated."""
  step = lambda state, batch: train_step(state, batch, task=task, tx=tx, base_rng=base_rng)
  batch_sharding = sharding_lib.batch_sharding(mesh)
  return jax.jit(step, in_shardings=(shardings, batch_sharding),
                 out_shardings=(shardings, None), donate_argnums=0)


def jit_eval_step(task: Task, shardings: TrainState, mesh: Mesh):
  step = lambda params, batch: eval_step(params, batch, task=task)
  return jax.jit(step, in_shardings=(shardings.params, sharding_lib.batch_sharding(mesh)))
