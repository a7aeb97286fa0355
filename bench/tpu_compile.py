"""Compiles encoder configs for Cloud TPU slices on this (CPU) host and tabulates what fits
(docs/performance.md, "Cloud TPU, compiled ahead of time").

  python bench/tpu_compile.py --out runs/tpu_compile            # every row x topology
  python bench/tpu_compile.py --out runs/tpu_compile --table    # the markdown table only

Each cell is one `jaxencoder-compile --json --max_batch` process (the train step at the
row's batch, then the largest batch that fits; `--max-batch-on` names the topologies that
search, the others compile the row's batch only, and search only when it does not fit),
its JSON kept in --out, so a rerun only compiles the cells that are missing. No speed: a
deviceless compile has none to give.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import time

BASE = ["model.num_layers=12", "model.emb_dim=768", "model.num_heads=12", "model.mlp_dim=3072"]
LARGE = ["model.num_layers=24", "model.emb_dim=1024", "model.num_heads=16", "model.mlp_dim=4096"]
VIT_B16 = [  # ViT-B/16 at 224 px, ImageNet-1k-sized head, no stem
    *BASE, "model.image_size=(224, 224)", "model.patch_size=16", "model.num_channels=3",
    "model.stem_channels=()", "model.stem_stride=1",
    "model.max_len=256", "model.dtype=bfloat16", "model.scan_layers=true",
    "model.remat_policy=save_dots", "num_classes=1000", "batch_size=256",
    "mesh_shape=(1, -1, 1)"]
ROWS = {
    "mlm_bert_base.py (as shipped: BERT-base, L=512)": ("configs/mlm_bert_base.py", []),
    "BERT-base MLM, L=128": ("configs/mlm_bert_base.py", ["data.seq_len=128"]),
    "BERT-large MLM, L=128": ("configs/mlm_bert_base.py", [*LARGE, "data.seq_len=128"]),
    "BERT-large MLM, L=512": ("configs/mlm_bert_base.py", LARGE),
    "modernbert_base.py (as shipped: L=1024)": ("configs/modernbert_base.py", []),
    "modernbert_base_long.py (as shipped: L=8192)": ("configs/modernbert_base_long.py", []),
    "ViT-B/16, 224 px": ("configs/vit_fashion_mnist.py", VIT_B16),
}
TOPOLOGIES = ("v5e-8", "v5p-8", "v6e-8")


def cell_path(out: pathlib.Path, row: str, topology: str) -> pathlib.Path:
  slug = "".join(c if c.isalnum() else "_" for c in row).strip("_")[:40]
  return out / f"{slug}__{topology}.json"


def run_cell(out: pathlib.Path, row: str, topology: str, timeout: int,
             max_batch: bool = True) -> None:
  path = cell_path(out, row, topology)
  if path.exists():
    return
  config, overrides = ROWS[row]
  command = [sys.executable, "-m", "jaxencoder.aot", "--config", config, "--topology", topology,
             "--steps", "train", *(["--max_batch"] if max_batch else []), "--json",
             *(f"--config.{o}" for o in overrides)]
  started = time.perf_counter()
  try:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired:
    path.write_text(json.dumps({"row": row, "error": f"timed out after {timeout} s"}))
    return
  try:
    result = json.loads(done.stdout)
  except json.JSONDecodeError:
    result = {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
  result.update(row=row, wall_seconds=round(time.perf_counter() - started, 1),
                command=" ".join(command[1:]))
  path.write_text(json.dumps(result, indent=1))
  print(f"{row} on {topology}: {result.get('verdict', result.get('error'))} "
        f"[{result['wall_seconds']:.0f} s]", flush=True)


def table(out: pathlib.Path) -> str:
  gib = 1 << 30
  lines = ["| config | target | compiles | memory / chip at batch (global) | largest batch per chip "
           "| matmul TFLOP / step | collective GiB / chip / step | attention | compile s |",
           "|---|---|---|---|---|---|---|---|---|"]
  for row in ROWS:
    for topology in TOPOLOGIES:
      path = cell_path(out, row, topology)
      if not path.exists():
        continue
      r = json.loads(path.read_text())
      step = r.get("steps", {}).get("train")
      if step is None:
        lines.append(f"| {row} | {topology} | no: {r.get('error', '?')} | | | | | | |")
        continue
      memory = step["memory_per_chip"].get("total_bytes", 0) / gib
      hbm = r["target"]["hbm_bytes_per_chip"] / gib
      fits = "" if step["fits"] else " (does not fit)"
      largest = r.get("max_batch")
      per_chip = "-" if largest is None else f"{largest / r['target']['chips']:g} ({largest})"
      attention = step.get("attention") or r["attention"]  # the train step's own
      kernel = (f"{attention['impl']} {attention['layers_on_kernel']}/{attention['num_layers']}"
                if attention["impl"] != "xla" else "xla")
      compiled = "yes" if step["compiled"] else ("out of memory" if step["out_of_memory"] else "no")
      flops = f"{step['flops'] / 1e12:.1f}" if step["compiled"] else "-"
      comm = (f"{sum(c['bytes'] for c in step['collectives'].values()) / gib:.2f}"
              if step["compiled"] else "-")
      lines.append(f"| {row} | {topology} | {compiled} | {memory:.2f} of {hbm:.4g} GiB at "
                   f"{step['batch_size']}{fits} | {per_chip} | {flops} | {comm} | {kernel} | "
                   f"{step['compile_seconds']:.0f} |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", type=pathlib.Path, required=True)
  parser.add_argument("--table", action="store_true", help="print the table of --out only")
  parser.add_argument("--rows", default="", help="comma-separated row numbers (0-based)")
  parser.add_argument("--topologies", default=",".join(TOPOLOGIES))
  parser.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
  parser.add_argument("--max-batch-on", default=",".join(TOPOLOGIES),
                      help="topologies whose cells search the largest batch")
  args = parser.parse_args()
  args.out.mkdir(parents=True, exist_ok=True)
  if not args.table:
    rows = list(ROWS)
    if args.rows:
      rows = [rows[int(i)] for i in args.rows.split(",")]
    for row in rows:
      for topology in args.topologies.split(","):
        run_cell(args.out, row, topology, args.timeout,
                 max_batch=topology in args.max_batch_on.split(","))
  print(table(args.out))


if __name__ == "__main__":
  main()
