"""Exports an encoder to run without jaxencoder: serialized StableHLO or ONNX (and, in
sentence_dir.py, a run as a sentence-transformers directory for jaxencoder-convert).

  s = servable(cfg, params)                  # or head=EncoderClassifier(...): its logits
  export_stablehlo(s, "out/model.stablehlo")  # jax.export, lowered for cpu, cuda, tpu
  export_onnx(s, "out/model.onnx")            # jax2onnx; onnxruntime runs it

A Servable is the model as a pure function of int32 [B, L] arrays (input_ids,
attention_mask, token_type_ids when the model has type embeddings), its params baked in,
B and L symbolic (L at most the position table's rows when positions are learned).
`load_exported(DIR)` runs what the CLI (`jaxencoder-export`, __main__.py) wrote there.
ONNX needs `pip install 'jaxencoder[export]'` and `pip install --no-deps jax2onnx==0.17.1`
(its metadata pins orbax-checkpoint < 0.11.37, which pip would satisfy by downgrading).
"""

from __future__ import annotations

from jaxencoder._lazy import lazy_exports

FILES = {"stablehlo": "model.stablehlo", "onnx": "model.onnx"}  # format -> file in DIR
SPEC = "export.json"
PLATFORMS = ("cpu", "cuda", "tpu")  # StableHLO lowered for each, one file
CHECK_SHAPE = (2, 16)  # the padded batch --check runs

# The Servable and its formats live in formats.py, imported on first use (PEP 562), so
# that jaxencoder-export's --help (which reads FILES and PLATFORMS) loads no JAX.
_MODULE_OF = {name: "formats" for name in (
    "Servable", "Unsupported", "servable", "trace", "primitives", "export_stablehlo",
    "export_onnx", "load_exported", "runner", "check", "example_batch", "describe")}
__all__ = list(_MODULE_OF)
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF, globals())
