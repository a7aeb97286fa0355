"""Probing: what each layer of an encoder represents, and how healthy it looks.

  feats = features.extract(cfg, params, tokenizer, features.read_dataset(path))
  probes.probe_all_layers(feats.layers, feats.labels_M, feats.sentence_ids_M, ...)
  study.run(cfg, params, tokenizer, dataset, out_dir)   # everything + report.json + PNGs
  study.run(cfg, params, None, images.read_dataset(path), out_dir)  # an image encoder

CLI: python -m jaxencoder.probing --pretrained HF_DIR --data FILE --out DIR
"""

from jaxencoder.probing import (attention_stats, features, health, images, probes, report,
                                representation, store)
from jaxencoder.probing.features import Dataset, Features, extract, load_features, read_dataset
from jaxencoder.probing.health import HealthThresholds, training_health, workdir_health
from jaxencoder.probing.probes import ProbeConfig, probe_all_layers
from jaxencoder.probing.representation import CollapseThresholds, effective_rank, layer_health
from jaxencoder.probing.study import StudyOptions, run

__all__ = ["attention_stats", "features", "health", "images", "probes", "report", "representation",
           "store",
           "Dataset", "Features", "extract", "load_features", "read_dataset", "HealthThresholds",
           "training_health", "workdir_health", "ProbeConfig", "probe_all_layers",
           "CollapseThresholds", "effective_rank", "layer_health", "StudyOptions", "run"]
