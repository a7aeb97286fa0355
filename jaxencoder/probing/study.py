"""One probing study end to end: features -> probes, attention, health -> report + plots.

  report = study.run(cfg, params, tokenizer, dataset, "out/")   # also writes out/*.png
  report = study.run(vit_cfg, params, None, images.read_dataset(path), "out/")  # images

Takes `(cfg, params, tokenizer)` directly, so any checkpoint source works; an
`images.ImageDataset` needs no tokenizer (its normalisation: `StudyOptions.image_norm`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import pathlib
import tempfile
import time

import numpy as np

from jaxencoder import progress as progress_lib
from jaxencoder.model.config import EncoderConfig
from jaxencoder.io.run_dir import RunDir
from jaxencoder.probing import features as features_lib
from jaxencoder.probing import (causal, head_study, health, images, mdl, probe_report, probes,
                                representation)


@dataclasses.dataclass(frozen=True)
class StudyOptions:
  pool: str | None = None  # see features.extract
  batch_size: int = 32
  max_length: int = 128
  stream: bool = True  # per-layer .npy memmaps on disk (False: every layer in memory)
  keep_features: bool = False  # streamed ones stay in out_dir/features (else: deleted)
  probe: probes.ProbeConfig = probes.ProbeConfig()
  mlp: bool = False  # also an MLP probe per layer
  control: bool = True  # control task + selectivity (word level only)
  sparsity_threshold: float = 0.1
  collapse: representation.CollapseThresholds = representation.CollapseThresholds()
  health_thresholds: health.HealthThresholds = health.HealthThresholds()
  attention_sentence: str | list[str] | None = None  # default: the first sentence
  image_norm: images.Normalisation | None = None  # None: as train.py (image_pipeline's)
  progress: bool = True  # each long phase on stderr (progress.bar / phase)
  mdl: bool = False  # also MDL probes (online code) per layer
  heads: bool = False  # head importance (mask each head; gradient estimate; pruning)
  heads_sentences: int = 128  # test-split sentences the head study runs on
  amnesic: bool = False  # amnesic probing (erase at each layer, rerun): needs model_params
  amnesic_sentences: int = 256  # test-split sentences its objective is scored on
  patch: str | None = None  # minimal pairs (JSON lines) to patch: needs an MLM head
  class_names: tuple[str, ...] | None = None  # a classifier run's classes (amnesic's loss)


def run(cfg: EncoderConfig, params, tokenizer, dataset: features_lib.Dataset, out_dir,
        options: StudyOptions = StudyOptions(), *, workdir=None, source: str = "",
        model_params=None) -> dict:
  """Runs every analysis, writes out_dir/report.json and the PNG plots; returns the report.
  `model_params`: the whole model's ({"encoder", head}), for options.amnesic / patch."""
  is_image = dataset.level == "image"
  count = len(dataset) if is_image else len(dataset.sentences)
  if count < probes.MIN_SENTENCES:
    raise ValueError(f"{count} {'images' if is_image else 'sentences'} are too few to probe "
                     f"(train, dev and test splits need at least {probes.MIN_SENTENCES})")
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  with feature_dir(out_dir, options) as features_at:
    return _study(cfg, params, tokenizer, dataset, out_dir, options, features_at,
                  workdir=workdir, source=source, model_params=model_params)


def feature_dir(out_dir: pathlib.Path, options: StudyOptions):
  """Where streamed features go: out_dir/features (kept), a scratch folder under out_dir
  (deleted when the study ends), or None (in memory)."""
  if not options.stream:
    return contextlib.nullcontext(None)
  if options.keep_features:
    return contextlib.nullcontext(out_dir / "features")
  return tempfile.TemporaryDirectory(dir=out_dir, prefix=".features-")


def _study(cfg, params, tokenizer, dataset, out_dir: pathlib.Path, options: StudyOptions,
           features_at, *, workdir, source: str, model_params=None) -> dict:
  """`run` once the features' place is settled."""
  is_image = dataset.level == "image"
  started = time.time()
  feats = _extract(cfg, params, tokenizer, dataset, options, features_at)
  rep = {"source": source, "data_source": getattr(dataset, "origin", ""),
         "task": task_name(feats), "layer_convention": LAYER_CONVENTION,
         "model": model_summary(cfg), "data": feats.info,
         "input": {"kind": dataset.level if is_image else "text", "pool": feats.info["pool"],
                   "normalisation": feats.info.get("normalisation")},
         "tokenizer": None if is_image else _tokenizer_summary(tokenizer, feats.info),
         "labels": feats.label_names, "extract_seconds": time.time() - started}
  rep["probes"] = _probes(feats, options)
  rep["majority_baseline"] = _majority(rep["probes"], feats.label_names)
  if options.mdl:
    rep["probes"]["mdl"] = _mdl(feats, options)
  if options.heads:
    if is_image:
      raise ValueError("--heads needs text data (word tags or sentence labels)")
    rep["heads"] = head_study.run(cfg, params, tokenizer, dataset, feats, options.probe,
                                  sentences=options.heads_sentences,
                                  batch_size=options.batch_size,
                                  max_length=options.max_length, progress=options.progress)
  if options.amnesic or options.patch:
    rep.update(causal.run(cfg, model_params, tokenizer, dataset, feats, rep, options))
  with progress_lib.phase(f"representation health of {len(feats.layers)} layers",
                          enabled=options.progress):
    rep["representation"] = representation.all_layers(feats.layers, options.collapse,
                                                      seed=options.probe.seed)
  rep["collapse_thresholds"] = dataclasses.asdict(options.collapse)
  rep["attention"] = feats.attention
  records = RunDir.open(workdir).read_metrics() if workdir is not None else []
  if records:
    rep["training_health"] = health.training_health(records, options.health_thresholds)
  with progress_lib.phase("attention maps and plots", enabled=options.progress):
    rep["plots"] = _plots(cfg, params, tokenizer, dataset, feats, rep, out_dir, options)
  rep["seconds"] = time.time() - started
  probe_report.write_json(rep, out_dir / "report.json")
  return rep


LAYER_CONVENTION = {
    "layer": "0 = embeddings; i = transformer block i (1..N)",
    "head": "0-based (0..H-1)",
    "matrices": "attention and heads [N][H] lists: row r is layer r + 1, column h head h"}


def task_name(feats: features_lib.Features) -> str:
  """What the probes predict, e.g. 'word tags (12 labels)'."""
  kind = {"word": "word tags", "sentence": "sentence labels", "image": "image labels"}
  return f"{kind[feats.info['level']]} ({len(feats.label_names)} labels)"


def _extract(cfg, params, tokenizer, dataset, options: StudyOptions, out_dir
             ) -> features_lib.Features:
  if dataset.level == "image":
    return images.extract(cfg, params, dataset, norm=options.image_norm, pool=options.pool,
                          batch_size=options.batch_size, out_dir=out_dir,
                          sparsity_threshold=options.sparsity_threshold,
                          progress=options.progress)
  extractor = features_lib.Extractor(cfg, params, sparsity_threshold=options.sparsity_threshold)
  return features_lib.extract(
      cfg, params, tokenizer, dataset, pool=options.pool, batch_size=options.batch_size,
      max_length=options.max_length, out_dir=out_dir, progress=options.progress,
      extractor=extractor)


def model_summary(cfg: EncoderConfig) -> dict:
  return {"family": cfg.family, "input_kind": cfg.input_kind, "num_layers": cfg.num_layers,
          "emb_dim": cfg.emb_dim,
          "num_heads": cfg.num_heads, "norm_position": cfg.norm_position,
          "attention_impl": cfg.attention_impl}


WORD_ALIGNMENTS = {"first": "first sub-word", "mean": "mean of sub-words"}


def _tokenizer_summary(tokenizer, info: dict) -> dict:
  """The tokenizer's kind and how words map to sub-words (word-level data only)."""
  alignment = WORD_ALIGNMENTS[info["pool"]] if info["level"] == "word" else None
  return {"kind": getattr(tokenizer, "kind", type(tokenizer).__name__),
          "word_alignment": alignment}


def _probes(feats: features_lib.Features, options: StudyOptions) -> dict:
  types = feats.types if options.control else None
  kinds = [options.probe] + ([dataclasses.replace(options.probe, kind="mlp")]
                             if options.mlp else [])
  return {cfg.kind: probes.probe_all_layers(feats.layers, feats.labels_M, feats.sentence_ids_M,
                                            len(feats.label_names), cfg, types=types,
                                            progress=options.progress)
          for cfg in kinds}


def _mdl(feats: features_lib.Features, options: StudyOptions) -> dict:
  """{"layers": per layer mdl.mdl_layer (with the control task's code where the study
  has one), "fractions"}: the same splits as the accuracy probes."""
  num_classes = len(feats.label_names)
  splits = probes.split_items(feats.sentence_ids_M, seed=options.probe.seed)
  control_M = None
  if options.control and feats.types is not None:
    control_M = probes.control_labels(feats.types, feats.labels_M, num_classes,
                                      seed=options.probe.seed)
  layers = []
  with progress_lib.bar(len(feats.layers), "MDL probes (online code)", unit="layer",
                        every=1, enabled=options.progress) as bar:
    for x_MxD in feats.layers:
      layers.append(mdl.mdl_layer(x_MxD, feats.labels_M, feats.sentence_ids_M, splits,
                                  num_classes, options.probe, control_M=control_M))
      bar.update(1)
  return {"layers": layers, "fractions": list(mdl.FRACTIONS),
          "control_task": control_M is not None}


def _majority(probe_results: dict, label_names: list[str]) -> dict:
  """The majority baseline: test accuracy of always answering the most frequent training
  label (every probe kind shares the splits)."""
  first = next(iter(probe_results.values()))
  return {"accuracy": first["majority_baseline"],
          "label": label_names[first["majority_label"]], "split": "test"}


def _plots(cfg, params, tokenizer, dataset, feats, rep, out_dir, options) -> list[str]:
  """Every PNG of the study; each title names the model, the data and the task."""
  context = probe_report.context(rep)
  paths = []
  for kind, result in rep["probes"].items():
    if kind == "mdl":
      paths.append(probe_report.plot_mdl(result, out_dir / "probe_mdl.png", context=context))
      continue
    paths.append(probe_report.plot_probe_accuracy(result, out_dir / f"probe_{kind}.png",
                                                  f"{kind} probe accuracy by layer",
                                                  context=context))
  if "heads" in rep:
    paths.append(probe_report.plot_head_heatmap(np.array(rep["heads"]["importance"]),
                                                out_dir / "head_importance.png",
                                                "loss increase when the head alone is dropped",
                                                fmt=".3f", context=context))
    paths.append(probe_report.plot_pruning(rep["heads"]["pruning"], out_dir / "head_pruning.png",
                                           context=context))
  paths += causal.plots(rep, out_dir, context)
  paths.append(probe_report.plot_cosine_by_layer(rep["representation"], out_dir / "cosine.png",
                                                 context=context))
  if feats.attention is not None:
    paths.append(probe_report.plot_head_heatmap(feats.attention["entropy"],
                                                out_dir / "attention_entropy.png",
                                                context=context))
  if feats.attention is not None and dataset.level != "image":
    paths += _attention_plots(cfg, params, tokenizer, dataset, feats, out_dir, options, context)
  return [str(p) for p in paths]


def _attention_plots(cfg, params, tokenizer, dataset, feats, out_dir, options, context):
  """All heads' maps for one sentence, and the lowest-entropy head's alone."""
  sentence = options.attention_sentence or dataset.sentences[0]
  tokens, probs_NxHxTxT = features_lib.sentence_attention(cfg, params, tokenizer, sentence)
  layer, head = np.unravel_index(np.argmin(feats.attention["entropy"]),
                                 feats.attention["entropy"].shape)
  return [probe_report.plot_attention_maps(tokens, probs_NxHxTxT,
                                           out_dir / "attention_maps.png", context=context),
          probe_report.plot_attention_map(
              tokens, probs_NxHxTxT[layer, head], out_dir / "attention_head.png",
              f"lowest-entropy head: layer {layer + 1}, head {head}", context=context)]


def headline(rep: dict) -> str:
  """One line: family, input kind, pooling (and for text the tokenizer)."""
  if rep["tokenizer"] is None:
    norm = rep["input"]["normalisation"]
    return (f"{rep['model']['family']} encoder, {rep['input']['kind']} input, "
            f"{rep['input']['pool']} pooling, normalised as {norm['source']}")
  return (f"{rep['model']['family']} encoder, {rep['tokenizer']['kind']} tokenizer"
          + (f", words as their {rep['tokenizer']['word_alignment']}"
             if rep["tokenizer"]["word_alignment"] else ""))


def summary(rep: dict) -> str:
  """A plain-text table: per layer, probe accuracy / selectivity ("-": no control task, as
  for sentence labels), the majority baseline beside them, and health."""
  accuracy_probes = {k: v for k, v in rep["probes"].items() if k != "mdl"}
  mdl = rep["probes"].get("mdl")
  names = [f"{k}_{col}" for k in accuracy_probes for col in ("acc", "sel")]
  names += ["mdl_comp", "ctrl_comp"] if mdl else []
  row_of = lambda cells: "  ".join(f"{c:>{len(name)}}" for c, name in zip(cells, names))
  lines = ["layer  " + row_of(names) + "  majority  mean_cos  erank_c  collapsed"]
  majority = rep["majority_baseline"]["accuracy"]
  for n, health_n in enumerate(rep["representation"]):
    cells = []
    for result in accuracy_probes.values():
      row = result["layers"][n]
      cells += [f"{row['accuracy']:.3f}", _signed(row.get("selectivity"))]
    if mdl:
      row = mdl["layers"][n]
      cells += [f"{row['compression']:.2f}",
                f"{row['control_compression']:.2f}" if "control_compression" in row else "-"]
    lines.append(f"{n:5d}  " + row_of(cells) + f"  {majority:8.3f}  {health_n['anisotropy']:8.3f}"
                 f"  {health_n['effective_rank_centered']:7.1f}  {health_n['collapsed']}")
  lines.append(f"majority: always {rep['majority_baseline']['label']!r}, the most frequent "
               "training label, scored on the test split")
  lines.append("layers: 0 = embeddings, i = transformer block i; heads count from 0")
  if mdl:
    lines.append("mdl_comp: uniform / online code length of the labels (1 = no information); "
                 "ctrl_comp: the same for the control task")
  if rep.get("heads"):
    study = rep["heads"]
    top = ", ".join(f"layer {h['layer']} head {h['head']} (+{h['importance']:.3f})"
                    for h in study["most_important"][:3])
    lines.append(f"heads ({study['sentences']} sentences, probe loss {study['base_loss']:.3f}, "
                 f"accuracy {study['base_accuracy']:.3f}): most important {top}")
  if rep.get("attention"):
    lines.append("attention entropy (nats), layer (1..N) x head (0..H-1):")
    lines += [f"{n + 1:5d}  " + " ".join(f"{v:.2f}" for v in row)
              for n, row in enumerate(rep["attention"]["entropy"])]
  if rep.get("training_health"):
    lines.append(health.verdict_line(rep["training_health"]))
  lines += causal.summaries(rep)
  return "\n".join(lines)


def _signed(value: float | None) -> str:
  """`+0.123`, or "-" where there is no value (no control task, or not finite)."""
  return f"{value:+.3f}" if value is not None and math.isfinite(value) else "-"
