"""Probing across training: the kept checkpoints of one run, one compiled extractor.

  jaxencoder-probe --checkpoint RUN --data tagged.txt --out out --steps all  # or 1000,2000
  rep = dynamics.run_steps(RUN, "all", cfg, tokenizer, dataset, "out/", options, rep)

Every step's features come from the same jitted forward (its params are an argument, so
each step reuses the compile); its linear probes use the main study's splits, probe
config and control task. Adds rep["probes"]["linear"]["steps"] (a list, ascending by
step, of {"step", "layers"}: the shape of rep["probes"]["linear"]["layers"]) and two
plots. Train with `keep_every_steps` to keep the steps to probe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import tempfile
import time
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.ticker import MaxNLocator

from jaxencoder import progress as progress_lib
from jaxencoder.model.config import EncoderConfig
from jaxencoder.io.run_dir import RunDir
from jaxencoder.pretrained.hf_checkpoint import resize_on_load
from jaxencoder.probing import features as features_lib
from jaxencoder.probing import probe_report, probes
from jaxencoder.model.restore_targets import encoder_params, restore_encoder, stored_config


def parse_steps(text: str, kept: Sequence[int]) -> list[int]:
  """'all' or a comma list ('1000,2000') of kept steps, ascending."""
  kept = sorted(kept)
  if text.strip().lower() == "all":
    return kept
  try:
    wanted = sorted({int(part) for part in text.split(",") if part.strip()})
  except ValueError:
    raise ValueError(f"--steps {text!r}: 'all' or comma-separated step numbers; "
                     f"kept steps: {kept}") from None
  missing = [s for s in wanted if s not in kept]
  if missing or not wanted:
    raise ValueError(f"--steps {text!r}: no checkpoint for step {missing or text!r}; "
                     f"kept steps: {kept}")
  return wanted


def chosen_steps(run: RunDir, steps: str) -> list[int]:
  """The kept steps of `run` that `steps` ('all', '1000,2000') names; a ValueError naming
  the kept ones otherwise (cheap: call it before the main study to fail early)."""
  return parse_steps(steps, run.steps())


def run_steps(workdir, steps: str, cfg: EncoderConfig, tokenizer,
              dataset: features_lib.Dataset, out_dir, options, rep: dict) -> dict:
  """Probes each chosen step of the run in `workdir` (a study.StudyOptions `options`; `cfg`
  of the newest step), adds the steps to `rep`, rewrites out_dir/report.json; returns rep."""
  if dataset.level == "image":
    raise ValueError("--steps probes text encoders (word or sentence labels), not images")
  run = RunDir.open(workdir)
  chosen = chosen_steps(run, steps)
  out_dir = pathlib.Path(out_dir)
  started = time.time()
  extractor, entries = None, []
  with progress_lib.bar(len(chosen), "probing kept steps", unit="step",
                        enabled=options.progress) as bar:
    for step in chosen:
      params = restore_step(run, step, cfg)
      extractor = extractor or features_lib.Extractor(
          cfg, params, sparsity_threshold=options.sparsity_threshold)
      layers = _probe_step(cfg, params, tokenizer, dataset, options, extractor, out_dir)
      entries.append({"step": step, "layers": layers})
      bar.set_postfix(step=step, best_accuracy=f"{max(r['accuracy'] for r in layers):.3f}")
      bar.update()
  rep["probes"]["linear"]["steps"] = entries
  rep["steps_study"] = {"steps": chosen, "compiles": extractor.traces,
                        "seconds": time.time() - started}
  rep["plots"] = rep["plots"] + [str(p) for p in _plots(entries, rep, out_dir)]
  probe_report.write_json(rep, out_dir / "report.json")
  return rep


def restore_step(run: RunDir, step: int, cfg: EncoderConfig):
  """The encoder params of `step`, resized as `cfg` (the newest step's, as loaded) is."""
  stored = stored_config(run, step)
  step_cfg, params = resize_on_load(stored, restore_encoder(run, encoder_params(stored),
                                                            step=step),
                                    max_len=cfg.max_len)
  if step_cfg != cfg:
    raise ValueError(f"{run.path}: step {step} holds another model than the newest step; "
                     "--steps probes the checkpoints of one architecture")
  return params


def _probe_step(cfg, params, tokenizer, dataset, options, extractor, out_dir) -> list[dict]:
  """Per-layer linear probe results of one step's params (the study's splits and control)."""
  streamed = tempfile.TemporaryDirectory(dir=out_dir) if options.stream else None
  with streamed or contextlib.nullcontext() as scratch:  # streamed: one step at a time
    feats = features_lib.extract(
        cfg, params, tokenizer, dataset, pool=options.pool, batch_size=options.batch_size,
        max_length=options.max_length, out_dir=scratch, progress=False, extractor=extractor)
    linear = dataclasses.replace(options.probe, kind="linear")
    result = probes.probe_all_layers(
        feats.layers, feats.labels_M, feats.sentence_ids_M, len(feats.label_names), linear,
        types=feats.types if options.control else None, progress=False)
  return result["layers"]


def _plots(entries: list[dict], rep: dict, out_dir: pathlib.Path) -> list[pathlib.Path]:
  majority = rep["probes"]["linear"]["majority_baseline"]
  context = probe_report.context(rep)
  return [plot_steps_heatmap(entries, out_dir / "probe_steps_heatmap.png", context=context),
          plot_steps_curves(entries, out_dir / "probe_steps_curves.png", majority,
                            context=context)]


def _grid(entries: Sequence[Mapping], key: str) -> np.ndarray | None:
  """[layers, steps] of `key` per layer and step; None if the layers lack it."""
  if key not in entries[0]["layers"][0]:
    return None
  return np.array([[row[key] for row in e["layers"]] for e in entries], float).T


def plot_steps_heatmap(entries: Sequence[Mapping], path, *, context: str = ""):
  """Layer x step heat maps of probe accuracy (and selectivity, given a control task)."""
  panels = [(k, g) for k in ("accuracy", "selectivity")
            if (g := _grid(entries, k)) is not None]
  steps = [e["step"] for e in entries]
  n, s = panels[0][1].shape
  fig, axes = probe_report.subplots(1, len(panels), squeeze=False, layout="constrained",
                           figsize=(len(panels) * max(4, 0.6 * s + 2), max(3, 0.45 * n + 1.5)))
  for ax, (key, grid_NxS) in zip(axes[0], panels):
    image = ax.imshow(grid_NxS, cmap="viridis", aspect="auto", origin="lower")
    if grid_NxS.size <= 300:
      middle = np.nanmean([np.nanmin(grid_NxS), np.nanmax(grid_NxS)])
      for i, j in np.ndindex(grid_NxS.shape):  # dark text on the bright (high) cells
        ax.text(j, i, f"{grid_NxS[i, j]:.2f}", ha="center", va="center", fontsize=6,
                color="k" if grid_NxS[i, j] > middle else "w")
    ax.set(xlabel="training step", title=f"probe {key}" + (f"\n{context}" if context else ""),
           xticks=range(s), yticks=range(n))
    ax.set_xticklabels([str(t) for t in steps], rotation=90 if s > 8 else 0)
    fig.colorbar(image, ax=ax)
  axes[0][0].set_ylabel(probe_report.LAYER_AXIS)
  return probe_report.save_figure(fig, path)


def plot_steps_curves(entries: Sequence[Mapping], path, majority: float | None = None, *,
                      context: str = ""):
  """Probe accuracy (and selectivity) against the training step, one line per layer."""
  panels = [(k, g) for k in ("accuracy", "selectivity")
            if (g := _grid(entries, k)) is not None]
  steps = [e["step"] for e in entries]
  fig, axes = probe_report.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
  for ax, (key, grid_NxS) in zip(axes[0], panels):
    for layer, values_S in enumerate(grid_NxS):
      ax.plot(steps, values_S, "o-", ms=3, label=f"layer {layer}")
    if key == "accuracy" and majority is not None:
      ax.axhline(majority, color="gray", ls=":", label="majority")
    if len(steps) <= 12:
      ax.set_xticks(steps)
    else:
      ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="training step", ylabel=key,
           title=f"probe {key} by step" + (f"\n{context}" if context else ""))
  handles, labels = axes[0][0].get_legend_handles_labels()  # the majority line too
  axes[0][-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                     borderaxespad=0.0)
  return probe_report.save_figure(fig, path)
