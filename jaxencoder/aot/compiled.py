"""Compiles the train and eval steps that train.py would run for a config, for a target's
devices, against abstract batches (no data read): what the compiler made of each (memory
per chip, FLOPs, collectives, kernels) and the largest batch that fits.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from typing import Any

import jax
import ml_collections
import numpy as np

from jaxencoder.model import flash
from jaxencoder.aot import hlo
from jaxencoder.train import sharding as sharding_lib
from jaxencoder.train import steps
from jaxencoder.train.batch_shapes import abstract_batch, batch_shapes, zeros_batch
from jaxencoder.train.config import encoder_config, rng_key  # the loop's dropout key
from jaxencoder.train.optim import make_optimizer, trainable_mask
from jaxencoder.train.parallel import compile_timed
from jaxencoder.tasks.registry import task_from_config

log = logging.getLogger("jaxencoder")

GIB = 1 << 30
_OOM_BYTES = re.compile(r"\(?([\d.]+)\s*([KMGT])i?B?\)?")
_UNIT = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclasses.dataclass
class StepReport:
  """One compiled step, per chip. `error`: the compiler's message, one line (`oom` when it
  ran out of device memory; `needed_bytes` is then its estimate, at least)."""
  name: str  # train | eval
  batch_size: int  # global
  compiled: bool
  compile_seconds: float
  error: str = ""
  oom: bool = False
  memory: dict[str, float] = dataclasses.field(default_factory=dict)
  flops: float = 0.0  # matmul FLOPs of the whole step (all chips)
  collectives: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
  kernels: dict[str, int] = dataclasses.field(default_factory=dict)
  unknown_trip_counts: int = 0
  # The attention plan of each layer of each encoder stack traced for the step.
  plans: list[tuple[flash.AttentionPlan, ...]] = dataclasses.field(default_factory=list)

  @property
  def needed_bytes(self) -> float:
    return self.memory.get("total_bytes", 0.0)


@dataclasses.dataclass
class Built:
  """What the steps need beyond the batch: task, optimizer, mesh and state."""
  config: ml_collections.ConfigDict
  task: Any
  tx: Any
  mesh: Any
  rules: Any
  shardings: Any
  state: Any  # abstract, with shardings
  param_count: int
  state_bytes_per_chip: float


def _per_chip_bytes(tree) -> float:
  """Bytes of one device's shards of a tree of sharded ShapeDtypeStructs."""
  total = 0.0
  for leaf in jax.tree.leaves(tree):
    shard = leaf.sharding.shard_shape(leaf.shape)
    total += math.prod(shard) * np.dtype(leaf.dtype).itemsize
  return total


def build(config: ml_collections.ConfigDict, devices, *, group: int | None = None) -> Built:
  """The task, optimizer, mesh and abstract train state that train.py's setup makes
  (train/loop.py), from the config alone."""
  task = task_from_config(config, encoder_config(config), num_classes=config.num_classes)
  mesh = sharding_lib.make_mesh(config.mesh_shape, devices)
  rules = sharding_lib.rules_from_config(config.logical_axis_rules)
  example = zeros_batch(batch_shapes(config, config.batch_size, train=True, group=group))
  with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # plans attention for the target
    boxed = steps.boxed_param_shapes(task, example)
  params = steps.param_shapes(task, example, boxed=boxed)
  tx, _ = make_optimizer(config.optim, params, num_layers=config.model.num_layers)
  shardings = steps.state_shardings(task, tx, example, mesh, rules, boxed=boxed)
  state = steps.abstract_state(task, tx, example, mesh, rules, shardings=shardings,
                               boxed=boxed)
  count = sum(math.prod(p.shape) for p in jax.tree.leaves(params))
  return Built(config, task, tx, mesh, rules, shardings, state, count, _per_chip_bytes(state))


def _memory(compiled) -> dict[str, float]:
  stats = compiled.memory_analysis()
  if stats is None:
    return {}
  memory = {"argument_bytes": stats.argument_size_in_bytes,
            "output_bytes": stats.output_size_in_bytes,
            "alias_bytes": stats.alias_size_in_bytes,
            "temp_bytes": stats.temp_size_in_bytes,
            "code_bytes": stats.generated_code_size_in_bytes}
  # Outputs aliased to donated arguments share their memory.
  memory["total_bytes"] = (memory["argument_bytes"] + memory["output_bytes"] -
                           memory["alias_bytes"] + memory["temp_bytes"] + memory["code_bytes"])
  return memory


def _oom_bytes(message: str) -> float:
  """The device memory an out-of-memory compile error says it needed (0 if unstated)."""
  amounts = [float(n) * _UNIT[u] for n, u in _OOM_BYTES.findall(message.split(":", 1)[-1])]
  return amounts[0] if amounts else 0.0


def one_line(error: Exception) -> str:
  lines = [l.strip() for l in str(error).splitlines() if l.strip()]
  return lines[0] if lines else type(error).__name__


def compile_step(built: Built, name: str, batch_size: int, *,
                 group: int | None = None) -> StepReport:
  """Compiles the train (state donated) or eval step for a global batch of `batch_size`."""
  config = built.config
  unit = batch_unit(built)
  if batch_size % unit:
    return StepReport(name, batch_size, False, 0.0, f"batch {batch_size} does not split over "
                      f"the mesh's data x fsdp = {unit} devices (train.py would refuse it)")
  micro_batches = config.optim.grad_accum_steps if name == "train" else 1
  shapes = batch_shapes(config, batch_size * micro_batches, train=name == "train", group=group)
  batch = abstract_batch(shapes, sharding_lib.batch_sharding(built.mesh))
  if name == "train":  # batch_size: one micro-batch's rows; the step reads k of them
    fn = steps.jit_train_step(built.task, built.tx, rng_key(config, 1), built.shardings,
                              built.mesh, micro_batches=micro_batches,
                              trainable=trainable_mask(built.state.params, config.optim))
    args = (built.state, batch)
  else:
    fn = steps.jit_eval_step(built.task, built.shardings, built.mesh)
    args = (built.state.params, batch)
  started = time.perf_counter()
  try:
    with steps.mesh_context(built.mesh, built.rules), flash.recorded_plans() as plans:
      compiled, _, seconds, flops = compile_timed(fn, *args)
  except Exception as e:  # the compiler's verdict is the report
    message = one_line(e)
    oom = "RESOURCE_EXHAUSTED" in message or "out of memory" in message.lower()
    report = StepReport(name, batch_size, False, time.perf_counter() - started, message, oom)
    if oom:  # the compiler's figure is for temporaries: add the state and the batch
      inputs = (built.state_bytes_per_chip if name == "train" else
                _per_chip_bytes(built.state.params)) + _per_chip_bytes(batch)
      report.memory = {"total_bytes": _oom_bytes(message) + inputs}
    return report
  ops = hlo.step_ops(compiled.as_text())
  return StepReport(name, batch_size, True, seconds, memory=_memory(compiled),
                    flops=float(flops or 0.0), collectives=ops.collectives,
                    kernels=ops.kernels, unknown_trip_counts=ops.unknown_trip_counts,
                    plans=plans)


def fits(report: StepReport, hbm_bytes: float) -> bool:
  return report.compiled and report.needed_bytes <= hbm_bytes


def batch_unit(built: Built) -> int:
  """Global batches split evenly over the mesh's batch axes (data x fsdp) and processes."""
  mesh = built.mesh
  return math.prod(mesh.shape[a] for a in sharding_lib.BATCH_AXES)


def largest_batch(built: Built, hbm_bytes: float, start: StepReport, *,
                  group: int | None = None, max_compiles: int = 8) -> tuple[int, list[StepReport]]:
  """The largest global train batch (a multiple of batch_unit; 0: none) that compiles
  within the chip's memory, to within 1/64 (or one unit), and the reports of the compiles
  it took. Memory grows about linearly with the batch: a line through the nearest two
  measured points proposes the next batch, until a fit and a miss that close (or
  `max_compiles`) end it."""
  unit = batch_unit(built)
  tried = {start.batch_size: start}
  lo = start.batch_size if fits(start, hbm_bytes) else 0  # largest known to fit
  hi = None if lo else start.batch_size  # smallest known not to fit
  close = lambda: max(unit, lo // 64 // unit * unit)  # within 1/64 of the limit will do
  while len(tried) <= max_compiles and (hi is None or hi - lo > close()):
    batch = _next_batch(tried, hbm_bytes, unit, lo, hi, built.state_bytes_per_chip, close())
    if batch in tried:
      break
    tried[batch] = report = compile_step(built, "train", batch, group=group)
    log.info("batch %d: %s", batch, _verdict(report, hbm_bytes))
    if fits(report, hbm_bytes):
      lo = batch
    else:
      hi = batch if hi is None else min(hi, batch)
  return lo, [tried[b] for b in sorted(tried) if b != start.batch_size]


def _next_batch(tried: dict[int, StepReport], hbm_bytes: float, unit: int, lo: int,
                hi: int | None, fixed_bytes: float, step: int) -> int:
  """A multiple of `unit` strictly between lo and hi: where a line through the two
  measured points nearest the limit crosses it; from one point, the line through it and
  the state's bytes at batch 0 (a little short of it); else doubling or halving."""
  points = sorted((b, r.needed_bytes) for b, r in tried.items() if r.needed_bytes > 0)
  near = sorted(sorted(points, key=lambda p: abs(p[1] - hbm_bytes))[:2])
  if len(near) == 2 and near[1][1] > near[0][1]:
    (b0, m0), (b1, m1) = near
    guess = int(b0 + (hbm_bytes - m0) * (b1 - b0) / (m1 - m0))
  elif len(near) == 1 and near[0][1] > fixed_bytes:
    (b0, m0), = near
    guess = int(0.95 * b0 * (hbm_bytes - fixed_bytes) / (m0 - fixed_bytes))
  elif hi is None:
    guess = 2 * max(lo, unit)
  else:
    guess = (lo + hi) // 2
  ceiling = hi - unit if hi is not None else 64 * max(lo, unit)
  return min(max(guess // unit * unit, lo + (step if hi is None else unit)), ceiling)


def _verdict(report: StepReport, hbm_bytes: float) -> str:
  if report.compiled:
    return f"{report.needed_bytes / GIB:.2f} GiB per chip ({'fits' if fits(report, hbm_bytes) else 'too big'})"
  return f"not compiled ({report.error[:120]})"
