"""jaxencoder: Transformer encoders in JAX/Flax, for text, image patches and time series
(and a decoder for encoder-decoder models)."""

from jaxencoder._lazy import lazy_exports
from jaxencoder.tpu_host import quiet_libtpu_probe

quiet_libtpu_probe()  # before JAX starts a backend: libtpu on a host without TPU chips

# Public name -> the module that defines it. Imported on first use (PEP 562), so that
# `import jaxencoder.<tool>` and every CLI's --help load no JAX or Flax.
_EXPORTS = {
    "model.config": ("PRESETS", "EncoderConfig"),
    "model.encoder": ("Encoder", "EncoderBlock", "BlockInputs", "EncoderOutput"),
    "model.decoder": ("Decoder", "EncoderDecoder", "decoder_config", "greedy_decode"),
    "model.heads": ("EncoderForMaskedLM", "EncoderForPreTraining", "MlmHead",
              "SequenceClassificationHead", "TokenClassificationHead", "ContrastiveHead",
              "cosine_similarity", "info_nce_loss"),
    "model.electra": ("Electra",),
    "model.interventions": ("Interventions",),
    "model.stack_layout": ("loop_to_scan", "scan_to_loop"),
    "loading": ("load", "LoadedModel"),  # any checkpoint by name or path
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = list(_MODULE_OF)
# The model's modules live in jaxencoder/model/ since 0.4; their old paths fail in one line.
_MOVED = {name: f"jaxencoder.model.{name}" for name in (
    "attention", "config", "decoder", "electra", "embeddings", "encoder", "ffn", "flash",
    "heads", "inputs", "layers", "lora", "masks", "pooling", "positions", "restore_targets",
    "stack_layout")}
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF, globals(), moved=_MOVED)


__version__ = "0.1.0"
