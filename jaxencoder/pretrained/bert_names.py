"""BERT's Hugging Face names and shapes <-> jaxencoder params (looped layout).

Facts only, no I/O: `encoder_config` reads a BertConfig dict, `hf_config` writes
one, and `slots` lists every tensor of a checkpoint with its HF name and shape,
our param path and shape, and whether it is a torch Linear weight ([out, in],
transposed in our [in, ..., out] kernels).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from jaxencoder.config import EncoderConfig
from jaxencoder.encoder import EMBEDDINGS, layer_name

# HF hidden_act -> our activation.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "relu": "relu"}
OUR_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}
# Non-parameter buffers that some checkpoints carry; skipped on load.
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
PREFIX = "bert."  # BertForMaskedLM / BertForPreTraining wrap the encoder under it
MLM_PREFIX = "cls.predictions."
TIED_DECODER = {"cls.predictions.decoder.weight": "embeddings.word_embeddings.weight",
                "cls.predictions.decoder.bias": "cls.predictions.bias"}


@dataclasses.dataclass(frozen=True)
class Slot:
  """One tensor: HF name/shape <-> our path/shape."""
  hf_name: str  # as in the file, e.g. "encoder.layer.0.attention.self.query.weight"
  hf_shape: tuple[int, ...]
  path: tuple[str, ...]  # e.g. ("layers_0", "attention", "query", "kernel")
  shape: tuple[int, ...]
  linear: bool = False  # torch Linear weight [out, in]

  def to_ours(self, tensor: np.ndarray) -> np.ndarray:
    return (tensor.T if self.linear else tensor).reshape(self.shape)

  def to_hf(self, param: np.ndarray) -> np.ndarray:
    param = np.asarray(param)
    if self.linear:  # ours is [in..., out...]: flatten to [in, out], then [out, in]
      return np.ascontiguousarray(param.reshape(self.hf_shape[::-1]).T)
    return param.reshape(self.hf_shape)


# ------------------------------------------------------------------ config.json
def encoder_config(hf: Mapping[str, Any], **overrides: Any) -> EncoderConfig:
  """EncoderConfig of a BertConfig dict (config.json); rejects what BERT-in-jaxencoder lacks."""
  model_type = hf.get("model_type", "bert")
  if model_type != "bert":
    raise ValueError(f"config.json: model_type={model_type!r}; only 'bert' is supported")
  act = hf.get("hidden_act", "gelu")
  if act not in HF_ACTIVATIONS:
    raise ValueError(f"config.json: hidden_act={act!r} is not one of {sorted(HF_ACTIVATIONS)}")
  position_kind = hf.get("position_embedding_type", "absolute")
  if position_kind != "absolute":
    raise ValueError(f"config.json: position_embedding_type={position_kind!r}; "
                     "only 'absolute' is supported")
  fields = dict(
      vocab_size=hf["vocab_size"], type_vocab_size=hf.get("type_vocab_size", 2),
      num_layers=hf["num_hidden_layers"], emb_dim=hf["hidden_size"],
      num_heads=hf["num_attention_heads"], mlp_dim=hf["intermediate_size"],
      max_len=hf.get("max_position_embeddings", 512), position_embedding="learned",
      activation=HF_ACTIVATIONS[act], norm="layernorm", norm_position="post",
      norm_eps=hf.get("layer_norm_eps", 1e-12),
      dropout_rate=hf.get("hidden_dropout_prob", 0.1),
      attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
      initializer_range=hf.get("initializer_range", 0.02))
  fields.update(overrides)
  return EncoderConfig.from_dict(fields)


def hf_config(cfg: EncoderConfig, *, masked_lm: bool) -> dict[str, Any]:
  """BertConfig fields (config.json) of an EncoderConfig; raises if BERT cannot express it."""
  check_bert_compatible(cfg)
  return {
      "architectures": ["BertForMaskedLM" if masked_lm else "BertModel"],
      "model_type": "bert", "vocab_size": cfg.vocab_size, "hidden_size": cfg.emb_dim,
      "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
      "intermediate_size": cfg.resolved_mlp_dim,
      "hidden_act": OUR_ACTIVATIONS[cfg.activation],
      "hidden_dropout_prob": cfg.dropout_rate,
      "attention_probs_dropout_prob": cfg.attention_dropout_rate,
      "max_position_embeddings": cfg.max_len, "type_vocab_size": cfg.type_vocab_size,
      "initializer_range": cfg.initializer_range, "layer_norm_eps": cfg.norm_eps,
      "position_embedding_type": "absolute", "pad_token_id": 0,
  }


def check_bert_compatible(cfg: EncoderConfig) -> None:
  """Raises ValueError listing every field a BERT checkpoint cannot represent."""
  wanted = {"input_kind": "text", "position_embedding": "learned", "norm": "layernorm",
            "norm_position": "post", "embedding_norm": True, "scale_embeddings": False,
            "use_bias": True, "causal": False, "sliding_window": None}
  bad = [f"{k}={getattr(cfg, k)!r} (BERT: {v!r})" for k, v in wanted.items()
         if getattr(cfg, k) != v]
  if cfg.activation not in OUR_ACTIVATIONS:
    bad.append(f"activation={cfg.activation!r} (BERT: one of {sorted(OUR_ACTIVATIONS)})")
  if cfg.resolved_head_dim * cfg.num_heads != cfg.emb_dim:
    bad.append(f"head_dim={cfg.resolved_head_dim} (BERT: emb_dim / num_heads)")
  if cfg.type_vocab_size < 1:
    bad.append("type_vocab_size=0 (BERT: >= 1)")
  if cfg.pooling == "attention":
    bad.append("pooling='attention' (BERT: cls, or mean/max via 1_Pooling)")
  if bad:
    raise ValueError("this EncoderConfig has no BERT equivalent: " + "; ".join(bad))


# ------------------------------------------------------------------ tensors
def encoder_slots(cfg: EncoderConfig, *, pooler: bool, prefix: str = "") -> list[Slot]:
  """Slots of BertModel, names after `prefix` ("bert." in BertForMaskedLM), looped layout."""
  d, f = cfg.emb_dim, cfg.resolved_mlp_dim
  h, k = cfg.num_heads, cfg.resolved_head_dim
  slots = [
      Slot("embeddings.word_embeddings.weight", (cfg.vocab_size, d),
           (EMBEDDINGS, "token_embed", "embedding"), (cfg.vocab_size, d)),
      Slot("embeddings.position_embeddings.weight", (cfg.max_len, d),
           (EMBEDDINGS, "position_embed", "embedding"), (cfg.max_len, d)),
      Slot("embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, d),
           (EMBEDDINGS, "type_embed", "embedding"), (cfg.type_vocab_size, d)),
      *norm_slots("embeddings.LayerNorm", (EMBEDDINGS, "norm"), d),
  ]
  for i in range(cfg.num_layers):
    slots += layer_slots(f"encoder.layer.{i}", layer_name(i), d, h, k, f)
  if pooler:
    slots += dense_slots("pooler.dense", ("pooler", "dense"), (d,), (d,))
  return [dataclasses.replace(s, hf_name=prefix + s.hf_name) for s in slots]


def layer_slots(hf: str, ours: str, d: int, h: int, k: int, f: int) -> list[Slot]:
  """One BertLayer: attention (q, k, v, out), its norm, the FFN and its norm."""
  slots = []
  for name in ("query", "key", "value"):
    slots += dense_slots(f"{hf}.attention.self.{name}", (ours, "attention", name), (d,), (h, k))
  slots += dense_slots(f"{hf}.attention.output.dense", (ours, "attention", "out"), (h, k), (d,))
  slots += norm_slots(f"{hf}.attention.output.LayerNorm", (ours, "attention_norm"), d)
  slots += dense_slots(f"{hf}.intermediate.dense", (ours, "ffn", "wi"), (d,), (f,))
  slots += dense_slots(f"{hf}.output.dense", (ours, "ffn", "wo"), (f,), (d,))
  slots += norm_slots(f"{hf}.output.LayerNorm", (ours, "ffn_norm"), d)
  return slots


def mlm_head_slots(cfg: EncoderConfig) -> list[Slot]:
  """BertForMaskedLM's head (full names); its decoder is tied to the word embeddings."""
  d = cfg.emb_dim
  return [*dense_slots("cls.predictions.transform.dense", ("transform",), (d,), (d,)),
          *norm_slots("cls.predictions.transform.LayerNorm", ("norm",), d),
          Slot("cls.predictions.bias", (cfg.vocab_size,), ("bias",), (cfg.vocab_size,))]


def dense_slots(hf: str, path: tuple[str, ...], in_shape: tuple[int, ...],
                out_shape: tuple[int, ...]) -> list[Slot]:
  """A torch Linear (weight [out, in], bias [out]) <-> our kernel [*in, *out], bias [*out]."""
  n_in, n_out = math.prod(in_shape), math.prod(out_shape)
  return [Slot(f"{hf}.weight", (n_out, n_in), (*path, "kernel"), in_shape + out_shape, linear=True),
          Slot(f"{hf}.bias", (n_out,), (*path, "bias"), out_shape)]


def norm_slots(hf: str, path: tuple[str, ...], d: int) -> list[Slot]:
  return [Slot(f"{hf}.weight", (d,), (*path, "scale"), (d,)),
          Slot(f"{hf}.bias", (d,), (*path, "bias"), (d,))]
