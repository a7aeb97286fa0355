"""Compile time of the full MLM train step vs depth, scanned vs looped layers.

  .venv/bin/python bench/compile.py [--depths 2,4,8,12,24 --preset small]

Times `jit(train_step).lower(...)` (tracing + StableHLO) and `.compile()` (XLA)
separately, from abstract inputs (nothing is run), with jax's caches cleared and the
persistent compilation cache off. Scan and loop alternate at each depth.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

from jaxencoder import EncoderConfig  # noqa: E402
from jaxencoder.train import optim  # noqa: E402
from jaxencoder.train import steps  # noqa: E402
from jaxencoder.tasks import registry  # noqa: E402


def abstract_step(preset: str, depth: int, scan: bool, batch: int, seq_len: int):
  """(jitted train step, abstract state, abstract batch) for one stack."""
  cfg = EncoderConfig.preset(preset, num_layers=depth, scan_layers=scan, vocab_size=30522)
  task = registry.make_task("mlm", cfg, max_predictions=round(0.15 * seq_len))
  ints = jax.ShapeDtypeStruct((batch, seq_len), jnp.int32)
  batch_spec = {"input_ids": ints, "attention_mask": ints, "token_type_ids": ints,
                "mlm_labels": ints,
                "mlm_weights": jax.ShapeDtypeStruct((batch, seq_len), jnp.float32)}
  init = lambda key, b: nn.meta.unbox(task.model.init(key, *task.example_batch(b))["params"])
  params = jax.eval_shape(init, jax.random.key(0), batch_spec)
  ocfg = optim.default_optim_config()
  ocfg.update(schedule="constant")
  tx, _ = optim.make_optimizer(ocfg, params, num_layers=depth)
  state = jax.eval_shape(lambda p: steps.TrainState(
      jnp.zeros((), jnp.int32), p, tx.init(p), jnp.full((), -1, jnp.int32)), params)
  step = functools.partial(steps.train_step, task=task, tx=tx, base_rng=jax.random.key(1))
  return jax.jit(step, donate_argnums=0), state, batch_spec


def measure(preset, depth, scan, batch, seq_len) -> dict:
  jax.clear_caches()
  start = time.perf_counter()
  fn, state, batch_spec = abstract_step(preset, depth, scan, batch, seq_len)
  lowered = fn.lower(state, batch_spec)
  lower_s = time.perf_counter() - start
  compile_s, _ = common.timed(lowered.compile)
  return {"depth": depth, "stack": "scan" if scan else "loop", "lower_s": lower_s,
          "compile_s": compile_s, "total_s": lower_s + compile_s,
          "hlo_chars": len(lowered.as_text())}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--depths", default="2,4,8,12,24")
  parser.add_argument("--preset", default="small", help="width/heads; depth is overridden")
  parser.add_argument("--batch", type=int, default=2)
  parser.add_argument("--seq-len", type=int, default=128)
  parser.add_argument("--stacks", default="scan,loop")
  parser.add_argument("--repeats", type=int, default=1, help="sweeps; medians are reported")
  args = parser.parse_args()
  jax.config.update("jax_enable_compilation_cache", False)
  runs = {}
  for _ in range(args.repeats):  # whole sweeps, so slow drifts in load hit every cell
    for depth in map(int, args.depths.split(",")):
      for stack in args.stacks.split(","):
        r = measure(args.preset, depth, stack == "scan", args.batch, args.seq_len)
        runs.setdefault((stack, depth), []).append(r)
        print(f"# {stack} depth {depth}: {r['total_s']:.1f}s", file=sys.stderr, flush=True)
  rows = [{**rs[0], **{k: common.median([r[k] for r in rs]) for k in ("lower_s", "compile_s",
                                                                         "total_s")},
           "total_s_all": [r["total_s"] for r in rs]} for rs in runs.values()]
  for r in rows:
    first = next(x for x in rows if x["stack"] == r["stack"])
    r["x_vs_shallowest"] = r["total_s"] / first["total_s"]
  common.print_json({"benchmark": "compile", "date": time.strftime("%Y-%m-%d"),
                     "machine": common.machine_info(), "preset": args.preset,
                     "batch": args.batch, "seq_len": args.seq_len, "results": rows})
  rows.sort(key=lambda r: (r["stack"] != "scan", r["depth"]))
  common.print_table(rows, ["stack", "depth", "lower_s", "compile_s", "total_s",
                            "x_vs_shallowest", "hlo_chars"])


if __name__ == "__main__":
  main()
