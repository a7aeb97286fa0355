"""Exported MiniLM (all-MiniLM-L6-v2) vs JAX: export time, file sizes, agreement, speed.

  .venv/bin/python bench/export_bench.py [--batch 8 --length 128 --repeats 20]

Exports the pretrained encoder (last_hidden_state + mean-pooled embedding) once per
format, with B and L symbolic; checks each reloaded export against JAX on padded batches
of two shapes; then times a batch of BATCH x LENGTH through JAX's jit (params baked in,
as exported), the reloaded StableHLO (jax.export.deserialize, jitted call) and
onnxruntime (CPU provider) on the ONNX file as written (dense layers as MatMul) and
as jax2onnx left it (`onnx_einsum`), alternating them, and prints their ratios to JAX.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import tempfile

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from jaxencoder import export, pretrained  # noqa: E402
from jaxencoder.pretrained.named_checkpoints import named_checkpoint  # noqa: E402
from jaxencoder.pretrained.hf_checkpoint import encoder_params  # noqa: E402

CHECK_SHAPES = ((2, 8), (3, 37))
WRITERS = (("stablehlo", "stablehlo", export.export_stablehlo),
           ("onnx", "onnx", export.export_onnx),
           ("onnx_einsum", "onnx", lambda s, path: export.export_onnx(s, path, matmul=False)))


def file_mib(out: pathlib.Path) -> float:
  return sum(f.stat().st_size for f in out.glob("model.*")) / 2**20


def max_diffs(s, run) -> dict[str, float]:
  """Largest |export - JAX| over the outputs, per checked shape."""
  diffs = {}
  for batch, length in CHECK_SHAPES:
    arrays = export.example_batch(s, batch, length)
    want, got = jax.jit(s.fn)(*arrays), run(*arrays)
    diffs[f"{batch}x{length}"] = max(float(np.max(np.abs(np.asarray(w) - g)))
                                     for w, g in zip(want, got))
  return diffs


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__)
  p.add_argument("--batch", type=int, default=8)
  p.add_argument("--length", type=int, default=128)
  p.add_argument("--repeats", type=int, default=20)
  args = p.parse_args()
  cfg, params, _ = pretrained.load(named_checkpoint("minilm"))
  s = export.servable(cfg, encoder_params(params))
  arrays = export.example_batch(s, args.batch, args.length)
  jitted = jax.jit(s.fn)
  runs, rows = {"jax": lambda *a: common.block(jitted(*a))}, []
  with tempfile.TemporaryDirectory() as tmp:
    for name, fmt, write in WRITERS:
      out = pathlib.Path(tmp, name)
      out.mkdir()
      seconds, _ = common.timed(lambda: write(s, out / export.FILES[fmt]))
      load_s, run = common.timed(lambda: export.runner(fmt, out / export.FILES[fmt], s.inputs))
      first_s, _ = common.timed(lambda: run(*arrays))
      runs[name] = run
      rows.append({"contender": name, "export_s": seconds, "file_mib": file_mib(out),
                   "load_s": load_s, "first_call_s": first_s,
                   **{f"max_diff_{k}": v for k, v in max_diffs(s, run).items()}})
    runs["jax"](*arrays)  # compiled before timing
    times = {name: [] for name in runs}
    for _ in range(args.repeats):  # alternating: machine load hits all alike
      for name, run in runs.items():
        times[name].append(common.timed(lambda: run(*arrays))[0])
  jax_ms = 1e3 * common.median(times["jax"])
  rows.insert(0, {"contender": "jax"})
  for row in rows:
    ms = 1e3 * common.median(times[row["contender"]])
    row.update(ms_per_batch=ms, vs_jax=ms / jax_ms)
  common.print_json({"bench": "export", "model": "all-MiniLM-L6-v2", "batch": args.batch,
                     "length": args.length, "repeats": args.repeats, "rows": rows,
                     **common.machine_info()})
  common.print_table(rows, ["contender", "ms_per_batch", "vs_jax", "export_s", "file_mib",
                            "load_s", "first_call_s"]
                     + [f"max_diff_{b}x{n}" for b, n in CHECK_SHAPES])


if __name__ == "__main__":
  main()
