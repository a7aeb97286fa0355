"""Run metrics: compiled FLOPs per step, MFU against known device peaks, and writers."""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from typing import Any, Mapping

import jax
import jax.extend.core as jex_core
from etils import epath

from jaxencoder.io.paths import as_path, copy_file, copy_tree, is_url
from jaxencoder.io.run_dir import METRICS, TENSORBOARD, read_metrics  # noqa: F401 (re-export)

# Dense bf16 peak FLOP/s per chip (vendor figures).
PEAK_BF16_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,  # v5e
    "TPU v5e": 197e12,
    "TPU v5p": 459e12,
    "TPU v5": 459e12,
    "TPU v6 lite": 918e12,  # v6e (Trillium)
    "TPU v6e": 918e12,
    "A100": 312e12,
    "H100": 989e12,
    "H200": 989e12,
}


def device_peak_flops(device: jax.Device | None = None) -> float | None:
  """bf16 peak of one device when its kind is in the table; None (e.g. CPU) otherwise."""
  kind = (device or jax.devices()[0]).device_kind
  for name in sorted(PEAK_BF16_FLOPS, key=len, reverse=True):
    if name.lower() in kind.lower():
      return PEAK_BF16_FLOPS[name]
  return None


def matmul_flops(jaxpr) -> float:
  """FLOPs of the matrix products (`dot_general`: 2 per multiply-add) in a (closed) jaxpr,
  with global shapes, so all devices together: the model FLOPs of MFU. A scan's body
  counts `length` times (XLA's cost analysis counts a loop body once: a scanned stack of N
  layers would count as one), a shard_map body once per device of its mesh, a Pallas
  kernel once per grid cell (block-sparse kernels skip cells: counted anyway); a cond its
  costliest branch; a while loop's body once.
  Products inside opaque calls (e.g. cuDNN attention) are not seen."""
  jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
  total = 0.0
  for eqn in jaxpr.eqns:
    name = eqn.primitive.name
    if name == "dot_general":
      (contract, _), _ = eqn.params["dimension_numbers"]
      lhs_shape = eqn.invars[0].aval.shape
      total += 2.0 * math.prod(eqn.outvars[0].aval.shape) * math.prod(
          lhs_shape[d] for d in contract)
      continue
    inner = [matmul_flops(sub) for sub in _sub_jaxprs(eqn.params)]
    if not inner:
      continue
    if name == "cond":
      total += max(inner)
      continue
    repeat = 1
    if name == "scan":
      repeat = eqn.params["length"]
    elif name == "shard_map":
      repeat = eqn.params["mesh"].size
    elif name == "pallas_call":
      repeat = math.prod(eqn.params["grid_mapping"].grid)
    total += repeat * sum(inner)
  return total


def _sub_jaxprs(params) -> list:
  found = []
  for value in params.values():
    for item in value if isinstance(value, (tuple, list)) else (value,):
      if isinstance(item, (jex_core.ClosedJaxpr, jex_core.Jaxpr)):
        found.append(item)
  return found


def throughput(step_seconds: float, tokens_per_step: int, examples_per_step: int,
               flops_per_step: float | None, num_devices: int) -> dict[str, float]:
  """tokens/s, examples/s, step time, achieved FLOP/s and MFU where the peak is known."""
  out = {"step_time_s": step_seconds, "tokens_per_s": tokens_per_step / step_seconds,
         "examples_per_s": examples_per_step / step_seconds}
  if flops_per_step:
    out["flops_per_step"] = flops_per_step
    out["achieved_flops_per_s"] = flops_per_step / step_seconds
    peak = device_peak_flops()
    if peak:
      out["mfu"] = out["achieved_flops_per_s"] / (peak * num_devices)
  return out


def train_line(step: int, total: int, values: Mapping[str, float], metric: str = "") -> str:
  """The one log line of a train interval (under 120 characters): step, loss, `metric` (the
  task's best_metric, unless loss), learning rate, seconds per step (always that unit),
  the share of time spent waiting for input and the time left. metrics.jsonl and
  TensorBoard hold every value."""
  seconds = values["step_time_s"]
  parts = [f"loss {values['loss']:.4g}"]
  if metric and metric != "loss" and metric in values:
    parts.append(f"{metric} {values[metric]:.4g}")
  parts += [f"lr {values['learning_rate']:.2e}", f"{seconds:.3g} s/step"]
  if "input_wait_fraction" in values:
    parts.append(f"input wait {values['input_wait_fraction']:.0%}")
  if step < total:
    parts.append(f"{_clock(seconds * (total - step))} left")
  return f"step {step}/{total}: " + ", ".join(parts)


def _clock(seconds: float) -> str:
  """h:mm:ss, or mm:ss under an hour."""
  h, rest = divmod(int(round(seconds)), 3600)
  return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:02d}:{rest % 60:02d}"


def _summary_writer():
  """tensorboardX's SummaryWriter, imported without torch: tensorboardX imports torch
  whenever it is installed, only to accept torch tensors (we pass floats); that import
  took 3 s of a run's 5 s set-up (2 CPU cores, torch 2.13 installed for `make parity`)."""
  hide = "torch" not in sys.modules
  if hide:
    sys.modules["torch"] = None  # `import torch` raises ImportError meanwhile
  try:
    from tensorboardX import SummaryWriter  # lazy: optional extra parity (torch) kept out
  finally:
    if hide:
      del sys.modules["torch"]
  return SummaryWriter


class MetricWriter:
  """Appends metrics to workdir/metrics.jsonl and TensorBoard events (process 0 only).

  A gs:// workdir cannot be appended to: both are written in a local staging folder
  (metrics.jsonl first copied from the workdir) and uploaded whole after every write.
  """

  def __init__(self, workdir: epath.PathLike, enabled: bool = True):
    self.enabled = enabled
    self._tb = None
    if not enabled:
      return
    workdir = as_path(workdir)
    self._remote = workdir if is_url(workdir) else None
    self._local = workdir
    if self._remote is not None:
      self._staging = tempfile.TemporaryDirectory(prefix="jaxencoder-metrics-")
      self._local = as_path(self._staging.name)
      if (workdir / METRICS).exists():
        copy_file(workdir / METRICS, self._local / METRICS)
    self._local.mkdir(parents=True, exist_ok=True)
    self._jsonl = open(self._local / METRICS, "a", encoding="utf-8")
    try:
      self._tb = _summary_writer()(os.fspath(self._local / TENSORBOARD))
    except ImportError:  # TensorBoard output is optional
      self._tb = None

  def write(self, step: int, split: str, values: Mapping[str, Any]) -> None:
    if not self.enabled:
      return
    scalars = {k: float(v) for k, v in values.items()}
    record = {"step": step, "split": split, "time": time.time(), **scalars}
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    if self._tb is not None:
      for name, value in scalars.items():
        self._tb.add_scalar(f"{split}/{name}", value, step)
    if self._remote is not None:
      if self._tb is not None:
        self._tb.flush()
      copy_tree(self._local, self._remote)

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      if self._tb is not None:
        self._tb.close()
      if self._remote is not None:
        copy_tree(self._local, self._remote)
        self._staging.cleanup()
