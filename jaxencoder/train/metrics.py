"""Run metrics: compiled FLOPs per step, MFU against known device peaks, and writers."""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any, Mapping

import jax

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


def compiled_flops(compiled) -> float | None:
  """FLOPs of one call of a compiled function, as XLA counts them (all devices)."""
  try:
    analysis = compiled.cost_analysis()
  except Exception:  # some backends do not implement it
    return None
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else {}
  flops = (analysis or {}).get("flops")
  return float(flops) if flops else None


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


class MetricWriter:
  """Appends metrics to workdir/metrics.jsonl and TensorBoard events (process 0 only)."""

  def __init__(self, workdir: str | pathlib.Path, enabled: bool = True):
    self.enabled = enabled
    self._tb = None
    if not enabled:
      return
    workdir = pathlib.Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    self._jsonl = open(workdir / "metrics.jsonl", "a", encoding="utf-8")
    try:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(str(workdir / "tensorboard"))
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

  def close(self) -> None:
    if self.enabled:
      self._jsonl.close()
      if self._tb is not None:
        self._tb.close()


def read_metrics(workdir: str | pathlib.Path) -> list[dict[str, Any]]:
  """The JSONL records written by MetricWriter."""
  path = pathlib.Path(workdir) / "metrics.jsonl"
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
