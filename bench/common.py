"""Shared helpers for the benchmarks: timing, peak memory, matmul peak, output.

Every benchmark prints one JSON line (machine-readable) and then a table. Times are
medians of repeats; comparisons alternate the contenders within one run, so that
load from other processes on a shared machine hits all of them alike.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import sys
import time
from typing import Any, Callable, Sequence


def median(xs: Sequence[float]) -> float:
  return float(statistics.median(xs))


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
  """(seconds, result) of one call; `fn` must block until its work is done."""
  start = time.perf_counter()
  out = fn()
  return time.perf_counter() - start, out


def repeat_times(fn: Callable[[], Any], repeats: int) -> list[float]:
  """Wall seconds of `repeats` blocking calls."""
  return [timed(fn)[0] for _ in range(repeats)]


def peak_rss_mib() -> float:
  """This process's peak resident set size so far (Linux reports KiB)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def block(tree):
  """Waits for every array in a pytree (jax arrays only; others pass through)."""
  import jax
  return jax.block_until_ready(tree)


def matmul_peak_flops(n: int = 4096, repeats: int = 5, dtype: str = "float32") -> float:
  """Measured FLOP/s of a jitted n x n @ n x n matmul (median of `repeats`)."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.dtype(dtype))
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.dtype(dtype))
  mm = jax.jit(jnp.dot)
  block(mm(a, b))
  secs = median(repeat_times(lambda: block(mm(a, b)), repeats))
  return 2 * n ** 3 / secs


def machine_info() -> dict[str, Any]:
  """Versions and CPU facts printed with every result."""
  info = {"python": platform.python_version(), "cpu_count": os.cpu_count(),
          "platform": platform.platform(), "processor": _cpu_model()}
  for mod in ("jax", "jaxlib", "flax", "optax", "torch", "transformers", "numpy"):
    if mod in sys.modules:
      info[mod] = getattr(sys.modules[mod], "__version__", "?")
  return info


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor()


def print_json(record: dict[str, Any]) -> None:
  print(json.dumps(record, default=_jsonable), flush=True)


def _jsonable(x):
  try:
    return float(x)
  except (TypeError, ValueError):
    return str(x)


def fmt(x: Any) -> str:
  if x is None:
    return "-"
  if isinstance(x, float):
    if x == 0 or 0.01 <= abs(x) < 1e5:
      return f"{x:.3g}" if abs(x) < 10 else f"{x:,.1f}"
    return f"{x:.3g}"
  return str(x)


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
  """A fixed-width table of `columns` from dict rows (missing cells print '-')."""
  cells = [[fmt(r.get(c, "-")) for c in columns] for r in rows]
  widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
  print("  ".join(c.rjust(w) for c, w in zip(columns, widths)))
  for row in cells:
    print("  ".join(v.rjust(w) for v, w in zip(row, widths)), flush=True)


def real_token_rate(it, batches: int) -> dict[str, Any]:
  """Real (attention_mask) tokens/s over the next `batches` batches of iterator `it`,
  and the share of slots that are real."""
  real = slots = 0
  start = time.perf_counter()
  for _ in range(batches):
    mask = next(it)["attention_mask"]
    real, slots = real + int(mask.sum()), slots + mask.size
  secs = time.perf_counter() - start
  return {"seconds": secs, "real_tokens_per_s": round(real / secs),
          "efficiency": round(real / slots, 4)}
