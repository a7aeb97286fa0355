"""PNG plots of a run's metrics.jsonl: loss, accuracy and learning rate against step.

  jaxencoder-plot RUN_DIR [--out DIR]     # default: RUN_DIR/plots (local runs)

For live curves, TensorBoard reads RUN_DIR/tensorboard (README: "Looking at a run").
"""

from __future__ import annotations

import argparse
import pathlib

from jaxencoder import cli
from jaxencoder.io.run_dir import read_metrics

PLOTS = {"loss": ("train", "eval"), "accuracy": ("train", "eval"), "learning_rate": ("train",)}


def plot_metrics(run_path, out_dir) -> list[pathlib.Path]:
  """Writes OUT/<metric>.png for each metric the run logged; returns the paths."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  records = read_metrics(run_path)
  if not records:
    raise FileNotFoundError(f"{run_path}: no metrics.jsonl rows to plot")
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  written = []
  for metric, splits in PLOTS.items():
    series = {s: [(r["step"], r[metric]) for r in records if r["split"] == s and metric in r]
              for s in splits}
    series = {s: points for s, points in series.items() if points}
    if not series:
      continue
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for split, points in series.items():
      steps, values = zip(*sorted(points))
      ax.plot(steps, values, "o-" if len(points) < 30 else "-", label=split, markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric}: {pathlib.Path(str(run_path)).name}")
    ax.legend()
    fig.tight_layout()
    path = out_dir / f"{metric}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)
  return written


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="jaxencoder-plot", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("run", help="a train.py workdir")
  parser.add_argument("--out", help="output directory (default: RUN/plots)")
  args = parser.parse_args(argv)
  out = args.out or pathlib.Path(args.run) / "plots"
  paths = cli.run_main(lambda: plot_metrics(args.run, out))
  print("wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
  main()
