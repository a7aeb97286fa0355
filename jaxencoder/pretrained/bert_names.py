"""BERT's Hugging Face names and shapes <-> jaxencoder params (looped layout).

Facts only, no I/O: `encoder_config` reads a BertConfig dict, `hf_config` writes
one, and `slots` lists every tensor of a checkpoint with its HF name and shape,
our param path and shape, and whether it is a torch Linear weight ([out, in],
transposed in our [in, ..., out] kernels). `Layout` bundles these per family;
`LAYOUT` is BERT's, and roberta_names / distilbert_names / electra_names give theirs.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import numpy as np

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import EMBEDDINGS, layer_name

# HF hidden_act -> our activation.
HF_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                  "relu": "relu"}
OUR_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}
# Non-parameter buffers that some checkpoints carry; skipped on load.
BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
PREFIX = "bert."  # BertForMaskedLM / BertForPreTraining wrap the encoder under it
MLM_PREFIX = "cls.predictions."


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


@dataclasses.dataclass(frozen=True)
class Head:
  """A task head a checkpoint may hold next to the encoder."""
  key: str  # our params key: "mlm_head", "discriminator_head"
  marker: str  # an HF name prefix only this head has, e.g. "cls.predictions."
  architecture: str  # the HF class of encoder + this head, written to config.json
  slots: Callable[[EncoderConfig], list[Slot]]  # full HF names
  tied: Callable[[str], dict[str, str]]  # encoder prefix -> {HF name: the tensor it equals}
  activation: str | None = None  # the head's fixed activation, if not the encoder's


@dataclasses.dataclass(frozen=True)
class Layout:
  """One Hugging Face family: its config.json reader / writer and tensor names."""
  family: str  # config.json's model_type
  architecture: str  # the encoder-only class, e.g. "BertModel"
  prefix: str  # the encoder's name prefix when a head is present, e.g. "bert."
  encoder_config: Callable[..., EncoderConfig]  # (config.json dict, **overrides)
  hf_config: Callable[[EncoderConfig], dict[str, Any]]  # without "architectures"
  encoder_slots: Callable[..., list[Slot]]  # (cfg, *, pooler, prefix)
  heads: tuple[Head, ...]
  buffers: tuple[str, ...] = BUFFERS  # non-parameter tensors skipped on load
  pooler: bool = True  # whether the family has BERT's pooler (dense + tanh)
  unsaved: tuple[str, ...] = ()  # our params keys `save` leaves out

  def head(self, key: str) -> Head:
    return next(h for h in self.heads if h.key == key)


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


def hf_config(cfg: EncoderConfig) -> dict[str, Any]:
  """BertConfig fields (config.json) of an EncoderConfig; raises if BERT cannot express it."""
  check_bert_compatible(cfg)
  return {
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


def config_mismatches(cfg: EncoderConfig, family: str, wanted: Mapping[str, Any],
                      activations: Mapping[str, str] = OUR_ACTIVATIONS) -> list[str]:
  """'field=ours (family: theirs)' for every `wanted` field cfg differs in, an activation
  not in the family's `activations`, and a head_dim other than emb_dim / num_heads."""
  bad = [f"{k}={getattr(cfg, k)!r} ({family}: {v!r})" for k, v in wanted.items()
         if getattr(cfg, k) != v]
  if cfg.activation not in activations:
    bad.append(f"activation={cfg.activation!r} ({family}: one of {sorted(activations)})")
  if cfg.resolved_head_dim * cfg.num_heads != cfg.emb_dim:
    bad.append(f"head_dim={cfg.resolved_head_dim} ({family}: emb_dim / num_heads)")
  return bad


def check_bert_compatible(cfg: EncoderConfig, family: str = "BERT",
                          **family_wants: Any) -> None:
  """Raises ValueError listing every field a BERT-like checkpoint cannot represent.

  `family_wants`: fields the family pins beyond BERT's, e.g. type_vocab_size=0.
  """
  wanted = {"input_kind": "text", "position_embedding": "learned", "norm": "layernorm",
            "norm_position": "post", "embedding_norm": True, "scale_embeddings": False,
            "use_bias": True, "causal": False, "sliding_window": None,
            "position_offset": 0, "embedding_dim": None, **family_wants}
  bad = config_mismatches(cfg, family, wanted)
  if cfg.type_vocab_size < 1 and "type_vocab_size" not in family_wants:
    bad.append(f"type_vocab_size=0 ({family}: >= 1)")
  if cfg.pooling == "attention":
    bad.append(f"pooling='attention' ({family}: cls, or mean/max via 1_Pooling)")
  if bad:
    raise ValueError(f"this EncoderConfig has no {family} equivalent: " + "; ".join(bad))


# ------------------------------------------------------------------ tensors
def encoder_slots(cfg: EncoderConfig, *, pooler: bool, prefix: str = "") -> list[Slot]:
  """Slots of BertModel, names after `prefix` ("bert." in BertForMaskedLM), looped layout.

  Also RobertaModel's and ElectraModel's (E-wide tables + `embeddings_project` when
  cfg.embedding_dim is set).
  """
  d, f = cfg.emb_dim, cfg.resolved_mlp_dim
  h, k = cfg.num_heads, cfg.resolved_head_dim
  slots = embedding_slots(cfg, "embeddings.LayerNorm")
  if cfg.embedding_dim is not None:
    slots += dense_slots("embeddings_project", (EMBEDDINGS, "project"), (cfg.embedding_dim,), (d,))
  for i in range(cfg.num_layers):
    slots += layer_slots(f"encoder.layer.{i}", layer_name(i), d, h, k, f)
  if pooler:
    slots += dense_slots("pooler.dense", ("pooler", "dense"), (d,), (d,))
  return [dataclasses.replace(s, hf_name=prefix + s.hf_name) for s in slots]


def embedding_slots(cfg: EncoderConfig, norm_name: str) -> list[Slot]:
  """Token, position (and type) tables and their norm, E = embedding_dim or emb_dim wide."""
  e = cfg.embedding_dim or cfg.emb_dim
  tables = [("word_embeddings", "token_embed", cfg.vocab_size),
            ("position_embeddings", "position_embed", cfg.max_len)]
  if cfg.type_vocab_size:
    tables.append(("token_type_embeddings", "type_embed", cfg.type_vocab_size))
  slots = [Slot(f"embeddings.{hf}.weight", (rows, e), (EMBEDDINGS, ours, "embedding"), (rows, e))
           for hf, ours, rows in tables]
  return slots + norm_slots(norm_name, (EMBEDDINGS, "norm"), e)


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
  return mlm_slots(cfg, "cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
                   "cls.predictions.bias")


def mlm_slots(cfg: EncoderConfig, dense: str, norm: str, bias: str) -> list[Slot]:
  """Our MlmHead (transform D -> E, norm, bias [V]) under a family's names."""
  d, e = cfg.emb_dim, cfg.embedding_dim or cfg.emb_dim
  return [*dense_slots(dense, ("transform",), (d,), (e,)), *norm_slots(norm, ("norm",), e),
          Slot(bias, (cfg.vocab_size,), ("bias",), (cfg.vocab_size,))]


def bert_tied(prefix: str) -> dict[str, str]:
  return {"cls.predictions.decoder.weight": prefix + "embeddings.word_embeddings.weight",
          "cls.predictions.decoder.bias": "cls.predictions.bias"}


def dense_slots(hf: str, path: tuple[str, ...], in_shape: tuple[int, ...],
                out_shape: tuple[int, ...]) -> list[Slot]:
  """A torch Linear (weight [out, in], bias [out]) <-> our kernel [*in, *out], bias [*out]."""
  n_in, n_out = math.prod(in_shape), math.prod(out_shape)
  return [Slot(f"{hf}.weight", (n_out, n_in), (*path, "kernel"), in_shape + out_shape, linear=True),
          Slot(f"{hf}.bias", (n_out,), (*path, "bias"), out_shape)]


def norm_slots(hf: str, path: tuple[str, ...], d: int) -> list[Slot]:
  return [Slot(f"{hf}.weight", (d,), (*path, "scale"), (d,)),
          Slot(f"{hf}.bias", (d,), (*path, "bias"), (d,))]


LAYOUT = Layout(
    family="bert", architecture="BertModel", prefix=PREFIX, encoder_config=encoder_config,
    hf_config=hf_config, encoder_slots=encoder_slots,
    heads=(Head("mlm_head", MLM_PREFIX, "BertForMaskedLM", mlm_head_slots, bert_tied),))
