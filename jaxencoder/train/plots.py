"""PNG plots of a run's metrics.jsonl against step: the loss and every eval metric the task
logs (train, eval and test points), the learning rate (the schedule of the run's stored
config at every step, the logged values over it), the gradient norm and the throughput.

  jaxencoder-plot RUN_DIR [--out DIR]     # default: RUN_DIR/plots (local runs)

For live curves, TensorBoard reads RUN_DIR/tensorboard (docs/training.md, "Looking at a run").
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Any

import numpy as np

from jaxencoder import cli

SPLITS = ("train", "eval", "test")
NOT_METRICS = ("step", "split", "time")
TRAIN_ONLY = ("learning_rate", "grad_norm")
SCHEDULE = "schedule"  # the label of the learning-rate line drawn from the config


def plot_metrics(run_path, out_dir) -> list[pathlib.Path]:
  """Writes OUT/<metric>.png for each metric the run logged (not one always 0); returns
  the paths."""
  from jaxencoder.io.run_dir import read_metrics  # lazy: --help stays fast
  records = read_metrics(run_path)
  if not records:
    raise FileNotFoundError(f"{run_path}: no metrics.jsonl rows to plot")
  figs = figures(records, run_config(run_path), title=pathlib.Path(str(run_path)).name)
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  written = []
  for metric, fig in figs.items():
    path = out_dir / f"{metric}.png"
    fig.savefig(path, dpi=100, bbox_inches="tight")
    written.append(path)
  return written


def run_config(run_path) -> dict[str, Any]:
  """The config stored with the run's latest checkpoint; {} without one."""
  from jaxencoder.io.run_dir import RunDir  # lazy: --help stays fast
  run = RunDir(run_path)
  return run.read_config() if run.latest_step() is not None else {}


def metric_names(records) -> list[str]:
  """The plots: loss, every numeric eval / test metric, then the train-only ones and the
  throughput (tokens/s, or examples/s where rows hold no tokens)."""
  names = ["loss"]
  for r in records:
    if r["split"] != "train":
      names += [k for k, v in r.items() if k not in names + list(NOT_METRICS)
                and isinstance(v, (int, float))]
  train = [r for r in records if r["split"] == "train"]
  tokens = any(r.get("tokens_per_s", 0) > 0 for r in train)
  names += [*TRAIN_ONLY, "tokens_per_s" if tokens else "examples_per_s"]
  return names


def never_nonzero(records) -> list[str]:
  """The metrics of `metric_names` whose every logged value is 0 (e.g. an MLM run's
  dropped_predictions): no plot, a flat line at 0 says nothing."""
  names = []
  for metric in metric_names(records):
    values = [v for _, vs in series(records, metric).values() for v in vs]
    if values and not any(values):
      names.append(metric)
  return names


def series(records, metric: str) -> dict[str, tuple[list[int], list[float]]]:
  """split -> (steps, values) of the rows holding `metric`, by step."""
  out = {}
  for split in SPLITS:
    points = sorted((r["step"], r[metric]) for r in records if r["split"] == split and metric in r)
    if points:
      out[split] = tuple(map(list, zip(*points)))
  return out


def schedule_line(config: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
  """(steps 1..num_train_steps, the learning rate update `step` applied), the convention
  of the logged learning_rate; from the stored config's optimizer schedule. None without
  a config."""
  if not config.get("optim") or not config.get("num_train_steps"):
    return None
  from jaxencoder.train.optim import learning_rate_schedule  # lazy: --help stays fast
  steps = np.arange(1, config["num_train_steps"] + 1)
  return steps, np.asarray(learning_rate_schedule(config["optim"])(steps - 1), np.float64)


def figures(records, config: dict[str, Any], *, title: str = "") -> dict[str, Any]:
  """metric -> a matplotlib Figure for each metric with points (see `metric_names`); no
  pyplot: nothing is kept open, no GUI backend is chosen."""
  # lazy: --help stays fast
  from matplotlib.figure import Figure
  from matplotlib.ticker import MaxNLocator
  out = {}
  flat = never_nonzero(records)
  for metric in metric_names(records):
    points = series(records, metric)
    if not points or metric in flat:
      continue
    fig = Figure(figsize=(6, 3.5))
    ax = fig.subplots()
    line = schedule_line(config) if metric == "learning_rate" else None
    if line is not None:
      ax.plot(*line, "-", label=SCHEDULE, color="0.6", linewidth=1)
    for split, (steps, values) in points.items():
      style = "o" if line is not None else "o-" if len(steps) < 30 else "-"
      ax.plot(steps, values, style, label=split, markersize=3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel(metric)
    ax.set_title(f"{metric}: {title}" if title else metric)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    out[metric] = fig
  return out


def build_parser() -> argparse.ArgumentParser:
  """jaxencoder-plot's flags (the CLI reference renders its help)."""
  parser = argparse.ArgumentParser(prog="jaxencoder-plot", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("run", help="a train.py workdir")
  parser.add_argument("--out", help="output directory (default: RUN/plots)")
  return parser


def main(argv=None) -> None:
  args = build_parser().parse_args(argv)
  out = args.out or pathlib.Path(args.run) / "plots"
  paths = cli.run_main(lambda: plot_metrics(args.run, out))
  print("wrote " + ", ".join(str(p) for p in paths))
  from jaxencoder.io.run_dir import read_metrics  # lazy: --help stays fast
  flat = never_nonzero(read_metrics(args.run))
  if flat:
    print(f"skipped (0 at every step): {', '.join(flat)}")


if __name__ == "__main__":
  main()
