"""How the loop runs steps: jit over a mesh (the default) or pmap (compatibility).

A stepper owns the train state while steps run: `step(batch)` advances it and returns
the step's metric sums; `state` is it in the one layout the loop and checkpoints know
(the jit path's sharded TrainState), so checkpoints move freely between the two. pmap's
replicated layout never leaves PmapStepper. Both compile the step ahead of time, timing
it: `trace_seconds` to lower (trace the model), `compile_seconds` in all.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxencoder.train import sharding as sharding_lib
from jaxencoder.train import steps
from jaxencoder.train.metrics import matmul_flops


def compile_timed(fn, *args):
  """(compiled fn, seconds to trace and lower, seconds in all, matmul FLOPs of one call)."""
  started = time.perf_counter()
  traced = fn.trace(*args) if hasattr(fn, "trace") else None  # pmap: lower only
  lowered = traced.lower() if traced is not None else fn.lower(*args)
  lowered_at = time.perf_counter()
  compiled = lowered.compile()
  flops = matmul_flops(traced.jaxpr) if traced is not None else None
  return compiled, lowered_at - started, time.perf_counter() - started, flops


@dataclasses.dataclass(frozen=True)
class GradientOptions:
  """How a step forms its gradient (steps.train_step): summed over `micro_batches` of the
  batch, applied to the `trainable` params only (optim.trainable_mask; None: all)."""
  micro_batches: int = 1
  trainable: Any = None


class JitStepper:
  """`train_step` jitted with NamedShardings over the run's mesh, state donated."""

  def __init__(self, task, tx, base_rng, shardings, mesh, rules, state, host_batch,
               grads: GradientOptions = GradientOptions()):
    self.mesh, self.rules = mesh, rules
    jitted = steps.jit_train_step(task, tx, base_rng, shardings, mesh,
                                  micro_batches=grads.micro_batches, trainable=grads.trainable)
    with steps.mesh_context(mesh, rules):
      self._step, self.trace_seconds, self.compile_seconds, self.flops = compile_timed(
          jitted, state, self.put(host_batch))
    self.state = state

  def put(self, host_batch):
    return sharding_lib.put_batch(host_batch, self.mesh)

  def step(self, batch):
    self.state, sums = self._step(self.state, batch)
    return sums

  @property
  def compiled(self):
    """The compiled step (its memory_analysis() names an out-of-memory step)."""
    return self._step


class PmapStepper:
  """`train_step` under jax.pmap: replicated state, [devices, B / devices, ...] batches,
  psum-ed gradients. Single-process data parallelism only."""

  AXIS = "batch"

  def __init__(self, task, tx, base_rng, shardings, state, host_batch,
               grads: GradientOptions = GradientOptions()):
    if jax.process_count() > 1:
      raise ValueError("parallelism='pmap' is single-process; use the default 'jit'")
    self.devices = jax.local_device_count()
    self.shardings = shardings
    self.flops = None
    step = lambda state, batch, rng: steps.train_step(
        state, batch, task=task, tx=tx, base_rng=rng, axis_name=self.AXIS,
        micro_batches=grads.micro_batches, trainable=grads.trainable)
    # One dropout key per device, so devices do not drop the same units.
    self._rngs = jax.vmap(lambda i: jax.random.fold_in(base_rng, i))(jnp.arange(self.devices))
    replicas = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct((self.devices,) + x.shape, x.dtype), state)
    self._step, self.trace_seconds, self.compile_seconds, _ = compile_timed(
        jax.pmap(step, axis_name=self.AXIS, donate_argnums=0), replicas,
        self.put(host_batch), self._rngs)
    host = jax.device_get(state)
    self._replicas = jax.tree.map(
        lambda x: np.broadcast_to(x, (self.devices,) + np.shape(x)), host)

  def put(self, host_batch):
    def split(x):
      x = np.asarray(x)
      if x.shape[0] % self.devices:
        raise ValueError(f"batch of {x.shape[0]} rows does not split over "
                         f"{self.devices} devices")
      return x.reshape(self.devices, x.shape[0] // self.devices, *x.shape[1:])
    return {k: split(v) for k, v in host_batch.items()}

  def step(self, batch):
    self._replicas, sums = self._step(self._replicas, batch, self._rngs)
    return jax.tree.map(lambda x: x[0], sums)  # identical on every device

  @property
  def compiled(self):
    """The compiled step (its memory_analysis() names an out-of-memory step)."""
    return self._step

  @property
  def state(self):
    """Replica 0 as the sharded TrainState. Through the host: replicas are identical, and
    a device-side x[0] of every leaf is one dispatch per leaf (it aborted XLA:CPU once
    under a loaded 8-device test run)."""
    host = jax.device_get(self._replicas)
    return jax.device_put(jax.tree.map(lambda x: x[0], host), self.shardings)


def make_stepper(parallelism: str, task, tx, base_rng, shardings, mesh, rules, state,
                 host_batch, grads: GradientOptions = GradientOptions()):
  """The stepper of `parallelism` ("jit" or "pmap"), its step compiled for `host_batch`."""
  if parallelism == "jit":
    return JitStepper(task, tx, base_rng, shardings, mesh, rules, state, host_batch, grads)
  if parallelism == "pmap":
    return PmapStepper(task, tx, base_rng, shardings, state, host_batch, grads)
  raise ValueError(f"parallelism={parallelism!r} is not one of ('jit', 'pmap')")
