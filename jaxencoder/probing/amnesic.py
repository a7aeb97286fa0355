"""Amnesic probing (`jaxencoder-probe --amnesic`; Elazar et al. 2021): does the model use
the property a probe decodes?

For each layer k (1..N, block k's output) LEACE (probing/erasure.py) is fitted on the
train split's layer-k features and labels, applied inside the forward pass at layer k
(every position; model/interventions.py), and the rest of the model runs. The model's own
objective on held-out sentences (objectives.py: MLM loss and accuracy on fixed masks, or a
classifier's loss) is compared with and without the erasure, and with a control eraser of
as many random directions (`random_eraser`). A linear probe fitted on erased train
features and scored on erased test features shows the erasure took: it should sit at the
majority baseline (`majority`). Layer 0 (the embeddings) is not erased.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxencoder import progress as progress_lib
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.interventions import Interventions
from jaxencoder.probing import erasure, objectives, probe_report, probes
from jaxencoder.probing import features as features_lib


@dataclasses.dataclass(frozen=True)
class AmnesicOptions:
  sentences: int = 256  # test-split sentences the objective is scored on
  mask_rate: float = 0.15  # MLM: fraction of each sentence's real tokens masked
  seed: int = 0  # the masks' and the random control's
  batch_size: int = 32
  max_length: int = 128


def held_out(feats: features_lib.Features, probe_cfg: probes.ProbeConfig, count: int):
  """(splits of the items as the probes split them, the first `count` test sentences)."""
  splits = probes.split_items(feats.sentence_ids_M, seed=probe_cfg.seed)
  return splits, np.unique(feats.sentence_ids_M[splits["test"]])[:count]


def objective_for(cfg: EncoderConfig, params, tokenizer, dataset, feats, sentence_ids,
                  options: AmnesicOptions, *, source: str = "the model", class_names=None):
  """The model's own objective on `sentence_ids` (objectives.MlmObjective, or a
  ClassifierObjective scored against the data's labels, as the head's `class_names` in
  index order; None: the data's label order); a ValueError for a model with neither."""
  head = objectives.head_of(params)
  if head == objectives.MLM_HEAD:
    return objectives.MlmObjective(cfg, params, tokenizer, dataset, sentence_ids,
                                   mask_rate=options.mask_rate, seed=options.seed,
                                   batch_size=options.batch_size, max_length=options.max_length)
  if head == objectives.CLASSIFIER_HEAD:
    classes_M = _class_ids(feats, class_names)
    starts = np.concatenate([[0], np.cumsum(np.bincount(feats.sentence_ids_M,
                                                        minlength=len(dataset.sentences)))])
    labels_of = lambda s: classes_M[starts[s]:starts[s + 1]]
    return objectives.ClassifierObjective(cfg, params, objectives.item_batches(
        tokenizer, dataset, sentence_ids, labels_of, batch_size=options.batch_size,
        max_length=min(options.max_length, cfg.max_positions)))
  raise ValueError(f"--amnesic {objectives.NEEDS_HEAD}; {source} has neither")


def _class_ids(feats: features_lib.Features, class_names) -> np.ndarray:
  """The items' labels as the classifier's class ids (`class_names`: its classes in order)."""
  if class_names is None:
    return feats.labels_M
  missing = [n for n in feats.label_names if n not in class_names]
  if missing:
    raise ValueError(f"--amnesic: the data's labels {missing[:5]} are not classes of the "
                     f"classifier ({', '.join(class_names[:10])}); score it on its own labels")
  return np.array([list(class_names).index(n) for n in feats.label_names])[feats.labels_M]


def run(cfg: EncoderConfig, feats: features_lib.Features, objective,
        probe_cfg: probes.ProbeConfig, *, seed: int = 0, probe_before=None,
        progress: bool = True) -> dict:
  """{"objective", "layers": [per layer k = 1..N: {"layer", "rank", "objective_before",
  "objective_after", "objective_after_random", "probe_before", "probe_after"}],
  "majority"}; `objective(interventions)` scores the model (objective_for);
  `probe_before`: the study's probe accuracy per layer (0..N), if it has them."""
  splits, _ = held_out(feats, probe_cfg, 0)
  num_classes = len(feats.label_names)
  train = splits["train"]
  before = objective(None)
  rows = []
  with progress_lib.bar(cfg.num_layers, "amnesic probing: erase, rerun", unit="layer",
                        every=1, enabled=progress) as bar:
    for k in range(1, cfg.num_layers + 1):
      x_MxD = np.asarray(feats.layers[k], np.float32)
      leace = erasure.fit_leace(x_MxD[train], feats.labels_M[train], num_classes=num_classes)
      control = erasure.random_eraser(x_MxD[train], leace.rank, seed=seed + k)
      erased_MxD = leace.apply(x_MxD)
      probe = probes.probe_layer(erased_MxD, feats.labels_M, splits, num_classes, probe_cfg)
      rows.append({"layer": k, "rank": leace.rank, "objective_before": before,
                   "objective_after": objective(_erase(cfg, k, leace)),
                   "objective_after_random": objective(_erase(cfg, k, control)),
                   "probe_before": None if probe_before is None else probe_before[k],
                   "probe_after": probe["accuracy"]})
      bar.update(1)
  return {"objective": _objective_name(before), "layers": rows,
          "majority": probes.majority_accuracy(feats.labels_M[train],
                                               feats.labels_M[splits["test"]]),
          "layer_convention": "layers[i] is layer i + 1 (block i + 1's output); "
                              "the embeddings (layer 0) are not erased"}


def _erase(cfg: EncoderConfig, layer: int, eraser: erasure.AffineEraser) -> Interventions:
  """The eraser applied to layer `layer` (1..N; interventions count 0..N-1): to
  hidden_states[layer], where its features were read (a pre-norm model's layer N after its
  final norm)."""
  return Interventions.erase(layer - 1, np.asarray(eraser.matrix_DxD, np.float32),
                             np.asarray(eraser.bias_D, np.float32), cfg.num_layers)


def _objective_name(value) -> str:
  return "masked LM loss and accuracy" if isinstance(value, dict) else "classifier loss"


def summary(result: dict) -> str:
  """A plain-text table: per layer the objective before / after / after random, and the
  probe's accuracy after erasure beside the majority baseline."""
  show = lambda v: (f"{v['loss']:.3f}/{v['accuracy']:.3f}" if isinstance(v, dict)
                    else f"{v:.3f}")
  unit = "loss/acc" if isinstance(result["layers"][0]["objective_before"], dict) else "loss"
  lines = [f"amnesic probing ({result['objective']}; {unit}): LEACE at layer k, the rest rerun",
           f"layer  rank  {'before':>13}  {'after':>13}  {'after_random':>13}  probe_before"
           "  probe_after  majority"]
  for row in result["layers"]:
    before = "-" if row["probe_before"] is None else f"{row['probe_before']:.3f}"
    lines.append(f"{row['layer']:5d}  {row['rank']:4d}  {show(row['objective_before']):>13}  "
                 f"{show(row['objective_after']):>13}  "
                 f"{show(row['objective_after_random']):>13}  {before:>12}  "
                 f"{row['probe_after']:11.3f}  {result['majority']:8.3f}")
  return "\n".join(lines)


def plot(result: dict, path, *, context: str = ""):
  """The objective per layer: before, after erasure, after the random control (loss;
  MLM accuracy on a second axis)."""
  rows = result["layers"]
  layers = [r["layer"] for r in rows]
  is_mlm = isinstance(rows[0]["objective_before"], dict)
  fig, axes = probe_report.subplots(2 if is_mlm else 1, 1, squeeze=False, sharex=True,
                                    figsize=(6, 6 if is_mlm else 4))
  metrics = ("loss", "accuracy") if is_mlm else (None,)
  for ax, metric in zip(axes[:, 0], metrics):
    value = (lambda v: v[metric]) if metric else (lambda v: v)
    before = {"ls": ":", "color": "black", "zorder": 4}  # on top of an equal control
    for key, label, style in (("objective_before", "before", before),
                              ("objective_after", "LEACE erased", {"marker": "o"}),
                              ("objective_after_random", "random directions erased",
                               {"marker": "s", "ls": "--", "mfc": "none"})):
      ax.plot(layers, [value(r[key]) for r in rows], label=label, **style)
    ax.set(ylabel=f"MLM {metric}" if metric else "classifier loss", xticks=layers)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
  title = "amnesic probing: the model's objective, the property erased at layer k"
  axes[0, 0].set_title(f"{title}\n{context}" if context else title)
  axes[-1, 0].set_xlabel("erased layer (i = block i's output)")
  return probe_report.save_figure(fig, path)
