"""Out of device memory, in one line: the step (train or eval), its batch, the bytes it
needs a device and the largest batch that fits.

The largest batch is an estimate from one compiled step: its memory analysis (arguments +
outputs - donated + temporaries + code) less the bytes that do not grow with the batch
(the state, or the params for eval) is taken to grow linearly with it. The gradients,
optimizer temporaries and code, which do not grow with it, count as growing, so the
estimate errs low. `jaxencoder-compile --max_batch` finds the largest train batch exactly,
by compiling (for TPU slices and NVIDIA GPUs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
from collections.abc import Callable, Iterator

import jax

from jaxencoder.data import kinds
from jaxencoder.train.batch_shapes import batch_shapes
from jaxencoder.train.sharding import batch_devices

log = logging.getLogger("jaxencoder")

GIB = 1 << 30
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# XLA:TPU's compile error: "Ran out of memory in memory space hbm. Used 21.90G of 7.48G hbm."
_TPU_USED = re.compile(r"Used ([\d.]+)([KMGT]?)i?B? of ([\d.]+)([KMGT]?)i?B? hbm")
_TPU_TOTAL = re.compile(r"Total hbm usage >= ([\d.]+)([KMGT]?)i?B?")


class OutOfMemory(RuntimeError):
  """A step ran out of device memory; the message is the one line that names it."""


def is_out_of_memory(error: BaseException) -> bool:
  """Whether `error` is XLA's out of device memory, at compile or at run time (a full disk,
  also RESOURCE_EXHAUSTED from tensorstore, is not)."""
  text = str(error)
  return (isinstance(error, jax.errors.JaxRuntimeError) and "No space left" not in text and
          (text.startswith("RESOURCE_EXHAUSTED") or "out of memory" in text.lower()))


@contextlib.contextmanager
def named(line: Callable[[Exception], str]) -> Iterator[None]:
  """Raises XLA's out of memory inside as OutOfMemory(line(error)); the error itself is
  its cause (JAXENCODER_TRACEBACK=1 shows it) and goes to the debug log."""
  try:
    yield
  except jax.errors.JaxRuntimeError as e:
    if not is_out_of_memory(e):
      raise
    log.debug("out of device memory", exc_info=e)
    try:
      text = line(e)
    except Exception as failed:  # the line must not hide the fault
      log.debug("no line for it", exc_info=failed)
      text = f"out of device memory: {str(e).strip().splitlines()[0]}"
    raise OutOfMemory(text) from e


@dataclasses.dataclass(frozen=True)
class Footprint:
  """One step's device memory, bytes a device: all it needs (None: unknown), the part
  that does not grow with the batch, and the device's limit (None: not reported, as on
  CPU)."""
  needed: float | None
  fixed: float
  limit: float | None


def needed_bytes(compiled) -> float | None:
  """Bytes a device holds while `compiled` runs, from its memory analysis (None without
  a compiled step, or where the backend gives none)."""
  stats = compiled.memory_analysis() if compiled is not None else None
  if stats is None:
    return None
  return float(stats.argument_size_in_bytes + stats.output_size_in_bytes -
               stats.alias_size_in_bytes + stats.temp_size_in_bytes +
               stats.generated_code_size_in_bytes)


def stated_bytes(message: str) -> tuple[float | None, float | None]:
  """(needed, limit) that a compiler's out-of-memory message states (XLA:TPU's "Used X of
  Y hbm", "Total hbm usage >= X"); None for what it does not state."""
  used, total = _TPU_USED.search(message), _TPU_TOTAL.search(message)
  amount = lambda n, unit: float(n) * _UNITS[unit]
  needed = amount(*total.groups()) if total else amount(*used.groups()[:2]) if used else None
  return needed, (amount(*used.groups()[2:]) if used else None)


def device_limit() -> float | None:
  """The bytes a local device may allocate (its allocator's limit); None where the
  backend reports none (CPU)."""
  stats = jax.local_devices()[0].memory_stats()
  return float(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


def per_device_bytes(tree) -> float:
  """Bytes of one device's shards of a tree of sharded arrays."""
  return float(sum(math.prod(x.sharding.shard_shape(x.shape)) * x.dtype.itemsize
                   for x in jax.tree.leaves(tree)))


def largest_batch(batch: int, footprint: Footprint, unit: int = 1) -> int | None:
  """The largest batch (a multiple of `unit`; 0: none) that fits the device, if the bytes
  beyond the fixed ones grow linearly with the batch:
  batch * (limit - fixed) / (needed - fixed). None when that cannot be told."""
  needed, fixed, limit = footprint.needed, footprint.fixed, footprint.limit
  if needed is None or limit is None or needed <= fixed:
    return None
  rows = batch * (limit - fixed) / (needed - fixed)
  return max(0, int(rows) // unit * unit)


def describe(step: str, error: Exception, config, fixed, compiled: Callable[[], object]) -> str:
  """The line for `step` (train | eval) of `config` out of memory: its batch, the bytes it
  needs, and about the largest batch that fits. `fixed`: what does not grow with the batch
  (the state, or the params); `compiled()`: the compiled step (its memory analysis), where
  the error's own figures do not say."""
  needed, limit = stated_bytes(str(error))
  if needed is None:
    with contextlib.suppress(Exception):  # e.g. out of memory again while compiling
      needed = needed_bytes(compiled())
  footprint = Footprint(needed, per_device_bytes(fixed), limit or device_limit())
  key = "batch_size" if step == "train" else "eval_batch_size"
  rows, unit = config[key], _batch_unit(config, train=step == "train")
  head = f"out of device memory in the {step} step at batch {_batch(config, key)}"
  if needed is not None:
    of = f" of {_size(footprint.limit)}" if footprint.limit else ""
    head += f" (about {_size(needed)} a device{of})"
  largest, fix = largest_batch(rows, footprint, unit), _fix(config, key)
  if largest is None:
    why = "no memory limit" if footprint.limit is None else "no memory analysis"
    return f"{head}; this backend reports {why} to estimate the largest {key} that fits from: {fix}"
  exact = ("; `jaxencoder-compile --topology TARGET --max_batch` searches it exactly"
           if step == "train" else "")
  return (f"{head}; the largest {key} that fits is about {largest} (estimate from the "
          f"memory analysis{exact}): {fix}")


def _size(n: float) -> str:
  return f"{n / GIB:.3g} GiB" if n >= GIB / 8 else f"{n / (1 << 20):.3g} MiB"


def _batch(config, key: str) -> str:
  """"256 x 512" (a batch of token rows), "64 x 32 x 32 x 3" (images): the shape of the
  batch's largest array; with micro-batches, how many a step reads."""
  rows, accum = config[key], config.optim.grad_accum_steps if key == "batch_size" else 1
  try:
    shapes = [shape for shape, _ in batch_shapes(config, rows, train=key == "batch_size").values()]
    words = " x ".join(map(str, max(shapes, key=math.prod)))
  except Exception:  # an odd config: the rows will do
    words = f"{rows} rows"
  return words + (f" (x {accum} micro-batches a step)" if accum > 1 else "")


def _batch_unit(config, *, train: bool) -> int:
  """Batch sizes that split over the data-parallel devices are multiples of this."""
  devices = batch_devices(config.mesh_shape, jax.device_count())[0]
  return devices // math.gcd(devices, config.optim.grad_accum_steps) if train else devices


def _fix(config, key: str) -> str:
  """What to lower, naming the keys and their values."""
  if key == "eval_batch_size":
    return f"lower eval_batch_size (now {config.eval_batch_size})"
  length = ("" if not kinds.kind_of(config.data.kind).has_length else
            f", or lower data.seq_len (now {config.data.seq_len})")
  return (f"lower batch_size (now {config.batch_size}) and raise optim.grad_accum_steps (now "
          f"{config.optim.grad_accum_steps}) to keep the rows a step{length}")
