"""The probing report (jaxencoder-probe's): one JSON file and PNG plots (matplotlib, Agg
backend) in a directory."""

from __future__ import annotations

import json
import math
import pathlib
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from jaxencoder import cli

# A name that lived here until issue 43 (pyplot is no longer used).
__getattr__ = cli.moved_names(__name__, {"pyplot": "jaxencoder.probing.probe_report.subplots"})


def to_jsonable(value):
  """Plain JSON: numpy arrays/scalars -> lists/numbers, NaN/inf -> None, tuples -> lists."""
  if isinstance(value, Mapping):
    return {str(k): to_jsonable(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [to_jsonable(v) for v in value]
  if isinstance(value, np.ndarray):
    return to_jsonable(value.tolist())
  if isinstance(value, np.generic):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def write_json(report: Mapping, path) -> pathlib.Path:
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(to_jsonable(report), indent=1) + "\n")
  return path


def subplots(nrows: int = 1, ncols: int = 1, *, squeeze: bool = True, sharex: bool = False,
             **figure_kw):
  """(a Figure, its axes) as pyplot.subplots makes them, on an Agg canvas of its own (files
  only): no pyplot, so no global backend or open figure, and a notebook's own stays as is."""
  fig = Figure(**figure_kw)
  FigureCanvasAgg(fig)
  return fig, fig.subplots(nrows, ncols, squeeze=squeeze, sharex=sharex)


def save_figure(fig, path) -> pathlib.Path:
  """Writes `fig` to `path` (PNG, tight bounding box) and closes it."""
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=110, bbox_inches="tight")
  return path


def context(rep: Mapping) -> str:
  """'model: M | data: D | task: T', the second line of every plot title."""
  return (f"model: {_short(rep.get('source') or rep['model']['family'])} | "
          f"data: {_short(rep.get('data_source') or '?')} | task: {rep.get('task', '?')}")


def _short(name: str, width: int = 40) -> str:
  """`name`, or its last `width` characters after an ellipsis (long paths keep their end)."""
  name = str(name)
  return name if len(name) <= width else "…" + name[-(width - 1):]


def _titled(what: str, context: str) -> str:
  return f"{what}\n{context}" if context else what


LAYER_AXIS = "layer (0 = embeddings, i = block i)"
HEAD_AXIS = "head (from 0)"
# The task line on top, thin; the control line under it, thick with open markers, so an
# equal control still shows around the task line.
TASK_STYLE = {"marker": "o", "ls": "-", "lw": 1.2, "ms": 4, "zorder": 3}
CONTROL_STYLE = {"marker": "s", "ls": "--", "lw": 2.5, "ms": 9, "mfc": "none", "alpha": 0.7,
                 "zorder": 2}


def _legend_outside(ax) -> None:
  """The legend right of the axes, where it covers no line or bar (saved with the figure:
  `save_figure` uses a tight bounding box)."""
  ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def plot_probe_accuracy(probe: Mapping, path, title: str = "probe accuracy by layer", *,
                        context: str = ""):
  """Task and control accuracy per layer with the majority baseline; selectivity (task -
  control) as bars on an axis of its own below."""
  rows = probe["layers"]
  layers = [r["layer"] for r in rows]
  has_control = "control_accuracy" in rows[0]
  fig, axes = subplots(2 if has_control else 1, 1, squeeze=False, sharex=True,
                       figsize=(6, 6 if has_control else 4))
  ax = axes[0, 0]
  ax.plot(layers, [r["accuracy"] for r in rows], label="task", **TASK_STYLE)
  if has_control:
    ax.plot(layers, [r["control_accuracy"] for r in rows], label="control", **CONTROL_STYLE)
  ax.axhline(probe["majority_baseline"], color="gray", ls=":", label="majority")
  ax.set(ylabel="accuracy", ylim=(0, 1.02), title=_titled(title, context), xticks=layers)
  _legend_outside(ax)
  if has_control:
    sel = axes[1, 0]
    sel.bar(layers, [r["selectivity"] for r in rows], color="tab:green", alpha=0.6)
    sel.axhline(0.0, color="black", lw=0.8)
    sel.set(ylabel="selectivity\n(task - control)", xticks=layers)
  axes[-1, 0].set_xlabel(LAYER_AXIS)
  return save_figure(fig, path)


def plot_head_heatmap(values_NxH: np.ndarray, path, title: str = "attention entropy (nats)",
                      fmt: str = ".2f", *, context: str = ""):
  """A layer x head heat map with the value written in each cell (format `fmt`); rows are
  layers 1..N (transformer blocks), columns heads 0..H-1."""
  values_NxH = np.asarray(values_NxH)
  n, h = values_NxH.shape
  fig, ax = subplots(figsize=(max(4, 0.55 * h + 2), max(3, 0.45 * n + 1.5)))
  image = ax.imshow(values_NxH, cmap="viridis", aspect="auto")
  for i in range(n):
    for j in range(h):
      ax.text(j, i, format(values_NxH[i, j], fmt), ha="center", va="center", fontsize=6,
              color="w")
  ax.set(xlabel=HEAD_AXIS, ylabel=LAYER_AXIS, title=_titled(title, context), xticks=range(h),
         yticks=range(n), yticklabels=[str(i + 1) for i in range(n)])
  fig.colorbar(image, ax=ax)
  return save_figure(fig, path)


def plot_cosine_by_layer(health: Sequence[Mapping], path, *, context: str = ""):
  """Mean pairwise cosine per layer with its 5-95% and 25-75% quantile bands."""
  layers = [r["layer"] for r in health]
  q = np.array([r["cosine"]["quantiles"] for r in health])
  fig, ax = subplots(figsize=(6, 4))
  ax.fill_between(layers, q[:, 0], q[:, 4], alpha=0.2, label="5-95%")
  ax.fill_between(layers, q[:, 1], q[:, 3], alpha=0.3, label="25-75%")
  ax.plot(layers, [r["cosine"]["mean"] for r in health], "o-", label="mean")
  ax.set(xlabel=LAYER_AXIS, ylabel="pairwise cosine", ylim=(-1, 1),
         title=_titled("cosine similarity by layer", context), xticks=layers)
  _legend_outside(ax)
  return save_figure(fig, path)


def plot_attention_maps(tokens: Sequence[str], probs_NxHxTxT: np.ndarray, path, *,
                        context: str = ""):
  """A grid of attention maps (rows: layers 1..N, columns: heads 0..H-1) for one sentence."""
  n, h, t, _ = probs_NxHxTxT.shape
  fig, axes = subplots(n, h, figsize=(1.6 * h + 1, 1.6 * n + 1), squeeze=False)
  for i in range(n):
    for j in range(h):
      ax = axes[i, j]
      ax.imshow(probs_NxHxTxT[i, j], cmap="Blues", vmin=0, vmax=1)
      ax.set_xticks([])
      ax.set_yticks([])
      if i == 0:
        ax.set_title(f"head {j}", fontsize=7)
      if j == 0:
        ax.set_ylabel(f"layer {i + 1}", fontsize=7)
  fig.suptitle(_titled("attention: " + " ".join(tokens)[:150], context)
               + "\nlayer 0 = embeddings, i = block i; heads from 0", fontsize=8)
  return save_figure(fig, path)


def plot_attention_map(tokens: Sequence[str], probs_TxT: np.ndarray, path, title: str = "", *,
                       context: str = ""):
  """One attention map, with the tokens on both axes (query rows, key columns)."""
  t = len(tokens)
  fig, ax = subplots(figsize=(0.3 * t + 2, 0.3 * t + 1.5))
  ax.imshow(probs_TxT, cmap="Blues", vmin=0, vmax=1)
  ax.set_xticks(range(t), tokens, rotation=90, fontsize=7)
  ax.set_yticks(range(t), tokens, fontsize=7)
  ax.set(xlabel="key", ylabel="query", title=_titled(title, context))
  return save_figure(fig, path)


def plot_mdl(mdl: Mapping, path, *, context: str = ""):
  """Compression (uniform / online code length) per layer, task and control."""
  layers = list(range(len(mdl["layers"])))
  fig, ax = subplots(figsize=(6, 4))
  ax.plot(layers, [r["compression"] for r in mdl["layers"]], label="task", **TASK_STYLE)
  if "control_compression" in mdl["layers"][0]:
    ax.plot(layers, [r["control_compression"] for r in mdl["layers"]], label="control",
            **CONTROL_STYLE)
  ax.axhline(1.0, color="gray", ls=":", label="uniform code")
  ax.set(xlabel=LAYER_AXIS, ylabel="compression (uniform / online bits)",
         title=_titled("MDL probe (online code)", context), xticks=layers)
  _legend_outside(ax)
  return save_figure(fig, path)


def plot_pruning(curve: Sequence[Mapping], path, *, context: str = ""):
  """The probe's loss as heads are dropped from least to most important."""
  fig, ax = subplots(figsize=(6, 4))
  ax.plot([p["pruned"] for p in curve], [p["loss"] for p in curve], "o-")
  ax.set(xlabel="heads dropped (least important first)", ylabel="probe loss (nats)",
         title=_titled("pruning curve", context))
  ax.xaxis.get_major_locator().set_params(integer=True)
  return save_figure(fig, path)
