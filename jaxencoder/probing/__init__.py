"""Probing: what each layer of an encoder represents, and how healthy it looks.

  feats = features.extract(cfg, params, tokenizer, features.read_dataset(path))
  probes.probe_all_layers(feats.layers, feats.labels_M, feats.sentence_ids_M, ...)
  study.run(cfg, params, tokenizer, dataset, out_dir)   # everything + report.json + PNGs
  study.run(cfg, params, None, images.read_dataset(path), out_dir)  # an image encoder

CLI: python -m jaxencoder.probing --pretrained HF_DIR --data FILE --out DIR
"""

from jaxencoder._lazy import lazy_exports

_MODULES = ("attention_stats", "erasure", "features", "head_importance", "health", "images", "load",
            "mdl", "probe_report", "probes", "representation", "similarity", "store", "study")
# Public name -> its module. Modules load on first use (PEP 562), so that the CLI's
# `--help` (jaxencoder.probing.__main__) loads no JAX.
_MODULE_OF = {
    **{name: name for name in _MODULES},
    **dict.fromkeys(("AffineEraser", "fit_inlp", "fit_leace", "random_eraser"), "erasure"),
    **dict.fromkeys(("Dataset", "Features", "extract", "load_features", "read_dataset"),
                    "features"),
    **dict.fromkeys(("HealthThresholds", "training_health", "workdir_health"), "health"),
    **dict.fromkeys(("ProbeConfig", "probe_all_layers"), "probes"),
    **dict.fromkeys(("CollapseThresholds", "effective_rank", "layer_health"), "representation"),
    **dict.fromkeys(("StudyOptions", "run"), "study"),
    **dict.fromkeys(("cka", "layer_cka"), "similarity"),
}
__all__ = list(_MODULE_OF)
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF, globals(), modules=_MODULES)
