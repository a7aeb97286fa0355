"""Hugging Face ViT directories (ViTModel, model_type "vit") <-> jaxencoder image encoders.

  cfg, params, _ = load(HF_DIR)                        # config.json + model.safetensors
  cfg, params, _ = load(HF_DIR, image_size=(64, 64))   # position grid resized (bicubic)
  save(OUT_DIR, cfg, params)                           # ViTModel.from_pretrained reads it

Names in the file (transformers renames its modules in memory, not on disk):
  embeddings.patch_embeddings.projection  Conv2d [D, C, p, p] -> patch_embed kernel [p*p*C, D]
  embeddings.cls_token [1, 1, D], embeddings.position_embeddings [1, 1+N, D] ([CLS] first)
  encoder.layer.i.{layernorm_before, attention.attention.{query,key,value},
    attention.output.dense, layernorm_after, intermediate.dense, output.dense}  (pre-norm)
  layernorm (after the stack), pooler.dense (+ tanh, optional)
HF takes pixel_values [B, C, H, W]; the Encoder takes images [B, H, W, C].
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.embeddings import num_positions
from jaxencoder.model.encoder import EMBEDDINGS, ENCODER, layer_name
from jaxencoder.model.stack_layout import loop_to_scan, scan_to_loop
from jaxencoder.pretrained import bert_names as names
from jaxencoder.pretrained import hf_checkpoint as hf
from jaxencoder.pretrained.resize import resize_positions

log = logging.getLogger(__name__)
PREFIX = "vit."  # ViTForImageClassification / ViTForMaskedImageModeling wrap the encoder
SKIPPED = ("embeddings.mask_token",)  # masked image modeling's input; unused by ViTModel
POOLER = ("pooler.dense.weight", "pooler.dense.bias")
Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class PatchSlot(names.Slot):
  """The patch Conv2d weight [D, C, p, p] <-> our kernel [p*p*C, D], rows in the (y, x, c)
  order of `embeddings.patchify`."""

  def to_ours(self, tensor: np.ndarray) -> np.ndarray:
    return tensor.transpose(2, 3, 1, 0).reshape(self.shape)

  def to_hf(self, param: np.ndarray) -> np.ndarray:
    d, c, p, _ = self.hf_shape
    return np.ascontiguousarray(np.asarray(param).reshape(p, p, c, d).transpose(3, 2, 0, 1))


# ------------------------------------------------------------------ load
def load(path: pathlib.Path, *, scan_layers: bool = False, dtype: str = "float32",
         pooling: str | None = None, image_size: tuple[int, int] | None = None
         ) -> tuple[EncoderConfig, Params, None]:
  """(EncoderConfig, Encoder params, None) of a ViTModel directory.

  `pooling` defaults to 1_Pooling/config.json, else "cls"; the pooler (dense + tanh) is
  kept only with "cls". `image_size` other than config.json's resamples the position grid
  (`resize_positions`, bicubic as transformers' interpolate_pos_encoding) with a warning.
  A ViTFor* checkpoint loads its encoder; its task head is named in a warning and dropped.
  """
  path = pathlib.Path(path)
  config = hf.read_json(path / hf.CONFIG)
  tensors = hf.read_tensors(path)
  pooling = pooling or hf.sentence_pooling(path) or "cls"
  prefix = PREFIX if any(n.startswith(PREFIX) for n in tensors) else ""
  has_pooler = prefix + POOLER[0] in tensors
  cfg = encoder_config(config, pooling=pooling, pooler_dense=has_pooler and pooling == "cls",
                       scan_layers=scan_layers, dtype=dtype, param_dtype=dtype)
  try:
    params = params_from_tensors(cfg, tensors, prefix=prefix)
  except ValueError as e:
    raise ValueError(f"{path / hf.WEIGHTS}: {e}") from None
  if image_size is not None and tuple(image_size) != cfg.image_size:
    cfg, params = resize_positions(cfg, params, image_size=tuple(image_size))
  return cfg, params, None


def encoder_config(config: Mapping[str, Any], **overrides: Any) -> EncoderConfig:
  """EncoderConfig of a ViTConfig dict; one ValueError names every option we lack."""
  d, heads = config["hidden_size"], config["num_attention_heads"]
  patch = _pair(config.get("patch_size", 16))
  act = config.get("hidden_act", "gelu")
  unsupported = {
      "model_type": (config.get("model_type", "vit") == "vit", "only 'vit'"),
      "hidden_act": (act in names.HF_ACTIVATIONS, f"one of {sorted(names.HF_ACTIVATIONS)}"),
      "qkv_bias": (config.get("qkv_bias", True), "True (use_bias covers every projection)"),
      "patch_size": (patch[0] == patch[1], "square"),
      "pooler_act": (config.get("pooler_act", "tanh") == "tanh", "'tanh'"),
      "pooler_output_size": (config.get("pooler_output_size") in (None, d), f"hidden_size={d}"),
  }
  bad = [f"{k}={config.get(k)!r} (supported: {want})" for k, (ok, want) in unsupported.items()
         if not ok]
  if bad:
    raise ValueError("config.json: ViT option(s) jaxencoder does not support: " + "; ".join(bad))
  head_dim = config.get("head_dim")
  fields = dict(
      input_kind="image", image_size=_pair(config.get("image_size", 224)), patch_size=patch[0],
      num_channels=config.get("num_channels", 3), use_cls_token=True, type_vocab_size=0,
      num_layers=config["num_hidden_layers"], emb_dim=d, num_heads=heads,
      head_dim=None if head_dim in (None, d // heads) else head_dim,
      mlp_dim=config["intermediate_size"], position_embedding="learned", embedding_norm=False,
      activation=names.HF_ACTIVATIONS[act], norm="layernorm", norm_position="pre",
      norm_eps=config.get("layer_norm_eps", 1e-12),
      dropout_rate=config.get("hidden_dropout_prob", 0.0),
      attention_dropout_rate=config.get("attention_probs_dropout_prob", 0.0),
      initializer_range=config.get("initializer_range", 0.02), family="vit")
  fields.update(overrides)
  return EncoderConfig.from_dict(fields)


def params_from_tensors(cfg: EncoderConfig, tensors: Mapping[str, np.ndarray], *,
                        prefix: str = "") -> Params:
  """Encoder params (layout per cfg.scan_layers) from ViT-named arrays."""
  slots = encoder_slots(cfg, pooler=cfg.pooler_dense, prefix=prefix)
  skipped = [prefix + n for n in SKIPPED + (() if cfg.pooler_dense else POOLER)]
  head = sorted(n for n in tensors if prefix and not n.startswith(prefix))
  if head:
    log.warning("not loaded (a task head, not the encoder): %s", head)
  hf.check_tensors(tensors, slots, skipped + head, tied={})
  dtype = jnp.dtype(cfg.param_dtype)
  params = hf.nest((s.path, jnp.asarray(s.to_ours(tensors[s.hf_name]), dtype)) for s in slots)
  return loop_to_scan(params) if cfg.scan_layers else params


# ------------------------------------------------------------------ save
def save(path: pathlib.Path, cfg: EncoderConfig, params: Params, tokenizer=None
         ) -> pathlib.Path:
  """Writes config.json + model.safetensors (float32) of a ViTModel (+ 1_Pooling for mean
  or max pooling). `params`: Encoder params or {"encoder": ...}, looped or scanned."""
  if tokenizer is not None:
    raise ValueError("a ViT checkpoint has no tokenizer; pass tokenizer=None")
  return hf.write_directory(path, cfg, hf_config(cfg), tensors_from_params(cfg, params))


def tensors_from_params(cfg: EncoderConfig, params: Params) -> dict[str, np.ndarray]:
  """ViT-named float32 arrays of our Encoder params."""
  check_vit_compatible(cfg)
  params = scan_to_loop(nn.meta.unbox(params))
  others = sorted(set(params) - {ENCODER}) if ENCODER in params else []
  if others:
    raise ValueError(f"params {others} have no ViTModel equivalent; pass the encoder's params")
  encoder = hf.encoder_params(params)
  slots = encoder_slots(cfg, pooler="pooler" in encoder)
  wanted, present = {s.path for s in slots}, set(hf.flatten(encoder))
  for label, paths in (("params with no ViT name", present - wanted),
                       ("params missing", wanted - present)):
    if paths:
      raise ValueError(f"{label}: {sorted('/'.join(p) for p in paths)}")
  return {s.hf_name: s.to_hf(np.asarray(hf.get(encoder, s.path), np.float32)) for s in slots}


def hf_config(cfg: EncoderConfig) -> dict[str, Any]:
  """ViTConfig fields (config.json) of an EncoderConfig."""
  check_vit_compatible(cfg)
  height, width = cfg.image_size
  return {
      "architectures": ["ViTModel"], "model_type": "vit", "hidden_size": cfg.emb_dim,
      "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
      "intermediate_size": cfg.resolved_mlp_dim,
      "hidden_act": names.OUR_ACTIVATIONS[cfg.activation],
      "hidden_dropout_prob": cfg.dropout_rate,
      "attention_probs_dropout_prob": cfg.attention_dropout_rate,
      "initializer_range": cfg.initializer_range, "layer_norm_eps": cfg.norm_eps,
      "image_size": height if height == width else [height, width],
      "patch_size": cfg.patch_size, "num_channels": cfg.num_channels, "qkv_bias": True,
      "encoder_stride": cfg.patch_size, "pooler_output_size": cfg.emb_dim, "pooler_act": "tanh",
  }


def check_vit_compatible(cfg: EncoderConfig) -> None:
  """Raises ValueError listing every field a ViTModel checkpoint cannot represent."""
  wanted = {"input_kind": "image", "use_cls_token": True, "position_embedding": "learned",
            "embedding_norm": False, "norm": "layernorm", "norm_position": "pre",
            "use_bias": True, "norm_bias": True, "first_attention_norm": True,
            "causal": False, "sliding_window": None, "stem_channels": (), "stem_stride": 1}
  bad = names.config_mismatches(cfg, "ViT", wanted)
  if cfg.pooling == "attention" or (cfg.pooling != "cls" and cfg.pooler_dense):
    bad.append(f"pooling={cfg.pooling!r} with pooler_dense={cfg.pooler_dense} (ViT: cls, "
               "with or without its pooler; mean/max without, via 1_Pooling)")
  if bad:
    raise ValueError("this EncoderConfig has no ViTModel equivalent: " + "; ".join(bad))


# ------------------------------------------------------------------ tensors
def encoder_slots(cfg: EncoderConfig, *, pooler: bool, prefix: str = "") -> list[names.Slot]:
  """Slots of ViTModel, names after `prefix`, looped layout."""
  d, f = cfg.emb_dim, cfg.resolved_mlp_dim
  h, k = cfg.num_heads, cfg.resolved_head_dim
  p, c, n = cfg.patch_size, cfg.num_channels, num_positions(cfg)
  slots = [
      PatchSlot("embeddings.patch_embeddings.projection.weight", (d, c, p, p),
                (EMBEDDINGS, "patch_embed", "kernel"), (p * p * c, d)),
      names.Slot("embeddings.patch_embeddings.projection.bias", (d,),
                 (EMBEDDINGS, "patch_embed", "bias"), (d,)),
      names.Slot("embeddings.cls_token", (1, 1, d), (EMBEDDINGS, "cls_token"), (d,)),
      names.Slot("embeddings.position_embeddings", (1, n, d),
                 (EMBEDDINGS, "position_embed", "embedding"), (n, d)),
  ]
  for i in range(cfg.num_layers):
    slots += layer_slots(f"encoder.layer.{i}", layer_name(i), d, h, k, f)
  slots += names.norm_slots("layernorm", ("final_norm",), d)
  if pooler:
    slots += names.dense_slots("pooler.dense", ("pooler", "dense"), (d,), (d,))
  return [dataclasses.replace(s, hf_name=prefix + s.hf_name) for s in slots]


def layer_slots(hf_name: str, ours: str, d: int, h: int, k: int, f: int) -> list[names.Slot]:
  """One ViTLayer, pre-norm: layernorm_before -> attention, layernorm_after -> MLP."""
  slots = []
  for name in ("query", "key", "value"):
    slots += names.dense_slots(f"{hf_name}.attention.attention.{name}",
                               (ours, "attention", name), (d,), (h, k))
  slots += names.dense_slots(f"{hf_name}.attention.output.dense", (ours, "attention", "out"),
                             (h, k), (d,))
  slots += names.norm_slots(f"{hf_name}.layernorm_before", (ours, "attention_norm"), d)
  slots += names.dense_slots(f"{hf_name}.intermediate.dense", (ours, "ffn", "wi"), (d,), (f,))
  slots += names.dense_slots(f"{hf_name}.output.dense", (ours, "ffn", "wo"), (f,), (d,))
  slots += names.norm_slots(f"{hf_name}.layernorm_after", (ours, "ffn_norm"), d)
  return slots


def _pair(value) -> tuple[int, int]:
  return (value, value) if isinstance(value, int) else tuple(value)
