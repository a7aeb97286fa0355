"""Where a CPU train step's time goes: jax.profiler trace joined with the compiled HLO.

  # jaxencoder (main venv)
  .venv/bin/python bench/profile_step.py --config base128
  # HF Flax BERT, same shapes (transformers<5 venv, see docs/performance.md)
  PYTHONPATH=. /tmp/hfflax/bin/python bench/profile_step.py --config base128 --framework hf_flax

Traces `--steps` compiled steps (after warm-up) with `jax.profiler.trace`, reads the
XLA:CPU thunk events back with `jax.profiler.ProfileData`, and prints
  1. time per op kind (thunk name without its .N suffix: ynn_fusion = a matmul fusion,
     copy, add_select_fusion, ...), with the thunk count;
  2. time and achieved GFLOP/s per matmul signature (shapes, layouts, contracted dims),
     FLOPs read from the compiled HLO.
Times are summed over XLA's worker threads (two ops may run at once, and one matmul may
use both cores), so they add up to more than the wall time; compare kinds and
frameworks, not absolutes. Same batch and weights as bench/train_step.py.
"""

from __future__ import annotations

import argparse
import collections
import glob
import math
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import train_step  # noqa: E402

SHAPE = r"\w+\[[\d,]*\](?:\{[\d,]*\})?"


def thunk_times_ms(trace_dir: str, steps: int) -> collections.Counter:
  """Per-step milliseconds of each XLA:CPU thunk name, summed over worker threads."""
  import jax
  path = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True))[-1]
  times = collections.Counter()
  for plane in jax.profiler.ProfileData.from_file(path).planes:
    for line in plane.lines:
      if line.name.startswith("tf_XLAEigen"):  # XLA:CPU's intra-op worker threads
        for event in line.events:
          times[event.name] += event.duration_ns / 1e6 / steps
  return times


def parse_hlo(hlo: str):
  """(instruction -> (called computation, text), computation -> body, value -> shape)."""
  bodies = {}
  for m in re.finditer(r"^%?([\w.\-]+) \((.*?)\) -> .*? \{\n(.*?)\n\}", hlo, re.S | re.M):
    bodies[m.group(1)] = m.group(3)
  shapes = dict(re.findall(rf"%([\w.\-]+) = ({SHAPE})", hlo))
  shapes.update(re.findall(rf"%?([\w.\-]+): ({SHAPE})", hlo))
  instructions = {}
  for line in hlo.splitlines():
    m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = \S+ [\w\-]+\(", line)
    if m:
      calls = re.search(r"calls=%?([\w.\-]+)", line)
      instructions[m.group(1)] = (calls.group(1) if calls else None, line)
  return instructions, bodies, shapes


def dims(shape: str) -> list[int]:
  return [int(x) for x in re.search(r"\[([\d,]*)\]", shape).group(1).split(",") if x]


def matmul_signature(text: str, shapes: dict[str, str]) -> tuple[str, float] | None:
  """(signature, FLOPs) of the first dot in an instruction or fused computation."""
  m = re.search(r"= (\S+) dot\((.*?)\), (lhs_batch_dims=\S+ )?lhs_contracting_dims=\{([\d,]*)\}"
                r"(.*?rhs_contracting_dims=\{[\d,]*\})", text)
  if not m:
    return None
  out, operands, lhs_batch, lhs_contract, rest = m.groups()
  operand_shapes = [shapes.get(o.strip().lstrip("%"), "?[]") for o in operands.split(",")]
  contracted = [dims(operand_shapes[0])[int(i)] for i in lhs_contract.split(",") if i]
  flops = 2.0 * math.prod(dims(out)) * math.prod(contracted)
  rest = re.sub(r"\s+", " ", rest.strip(", "))
  sig = (f"{out} = {' x '.join(operand_shapes)} {lhs_batch or ''}"
         f"lhs_contracting_dims={{{lhs_contract}}} {rest}")
  return sig, flops


def summarise(times: collections.Counter, hlo: str) -> tuple[list[dict], list[dict]]:
  """Rows by op kind and rows by matmul signature."""
  kinds, counts = collections.Counter(), collections.Counter()
  for name, ms in times.items():
    if name.startswith(("ThunkExecutor", "SlinkyThreadPool")):
      continue  # containers / waits, not ops
    kind = re.sub(r"\.\d+$", "", name)
    kinds[kind] += ms
    counts[kind] += 1
  instructions, bodies, shapes = parse_hlo(hlo)
  dot_ms, dot_flops, dot_n = collections.Counter(), collections.Counter(), collections.Counter()
  for name, ms in times.items():
    if name not in instructions:
      continue
    called, line = instructions[name]
    found = matmul_signature(bodies.get(called, line) if called else line, shapes)
    if found:
      dot_ms[found[0]] += ms
      dot_flops[found[0]] += found[1]
      dot_n[found[0]] += 1
  total = sum(kinds.values())
  kind_rows = [{"op kind": k, "ms/step": ms, "share": ms / total, "thunks": counts[k]}
               for k, ms in kinds.most_common()]
  dot_rows = [{"ms/step": ms, "n": dot_n[s], "GFLOP": dot_flops[s] / 1e9,
               "GFLOP/s": dot_flops[s] / ms / 1e6, "matmul": s}
              for s, ms in dot_ms.most_common()]
  return kind_rows, dot_rows


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--config", default="base128", choices=sorted(train_step.CONFIGS))
  parser.add_argument("--framework", default="jaxencoder",
                      choices=("jaxencoder", "jaxencoder_full", "hf_flax"))
  parser.add_argument("--steps", type=int, default=2, help="traced steps (after 2 warm-up)")
  parser.add_argument("--top", type=int, default=20, help="rows per table")
  parser.add_argument("--trace-dir", default=None, help="keep the trace here (else a temp dir)")
  args = parser.parse_args()
  import jax

  preset, seq_len, batch_size = train_step.CONFIGS[args.config]
  batch = train_step.make_batch(batch_size, seq_len)
  ours = train_step.JaxencoderRunner(preset, batch, full_logits=args.framework != "jaxencoder")
  runner = ours
  if args.framework == "hf_flax":
    model_dir = tempfile.mkdtemp()
    ours.save(model_dir)
    runner = train_step.HfFlaxRunner(preset, batch, model_dir)
  runner.compile()
  step_s = common.repeat_times(runner.step, 2 + args.steps)[2:]
  trace_dir = args.trace_dir or tempfile.mkdtemp(prefix="profile_step_")
  with jax.profiler.trace(trace_dir):
    for _ in range(args.steps):
      runner.step()
  kind_rows, dot_rows = summarise(thunk_times_ms(trace_dir, args.steps),
                                  runner.step_fn.as_text())
  dot_ms = sum(r["ms/step"] for r in dot_rows)
  total_ms = sum(r["ms/step"] for r in kind_rows)
  common.print_json({"bench": "profile_step", "config": args.config,
                     "framework": args.framework, "step_s": common.median(step_s),
                     "thread_ms_per_step": total_ms, "matmul_thread_ms_per_step": dot_ms,
                     "kinds": kind_rows[:args.top], "matmuls": dot_rows[:args.top],
                     "versions": common.machine_info(), "trace_dir": trace_dir})
  print(f"\n{args.framework} {args.config}: step {common.median(step_s):.2f} s (median of "
        f"{args.steps} untraced); thread-summed op time {total_ms:.0f} ms/step, of which "
        f"matmuls {dot_ms:.0f} ms ({dot_ms / total_ms:.0%})\n")
  common.print_table(kind_rows[:args.top], ["op kind", "ms/step", "share", "thunks"])
  print()
  common.print_table(dot_rows[:args.top], ["ms/step", "n", "GFLOP", "GFLOP/s", "matmul"])


if __name__ == "__main__":
  main()
