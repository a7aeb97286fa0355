"""DistilBERT's Hugging Face names <-> jaxencoder params.

A post-norm BERT without token types or pooler: `transformer.layer.N.attention.
{q,k,v,out}_lin`, `sa_layer_norm`, `ffn.lin1/lin2`, `output_layer_norm`; every
LayerNorm has eps 1e-12. DistilBertForMaskedLM: `distilbert.` + `vocab_transform`,
`vocab_layer_norm`, `vocab_projector` (weight tied to the word embeddings).
A `sinusoidal_pos_embds` checkpoint stores its (fixed) table, which loads as learned.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import layer_name
from jaxencoder.pretrained import bert_names as bert

PREFIX = "distilbert."
NORM_EPS = 1e-12  # hard-coded in transformers' DistilBERT
ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}


def encoder_config(hf: Mapping[str, Any], **overrides: Any) -> EncoderConfig:
  """EncoderConfig of a DistilBertConfig dict (config.json)."""
  act = hf.get("activation", "gelu")
  if act not in ACTIVATIONS:
    raise ValueError(f"config.json: activation={act!r} is not one of {sorted(ACTIVATIONS)}")
  fields = dict(
      vocab_size=hf["vocab_size"], type_vocab_size=0, num_layers=hf["n_layers"],
      emb_dim=hf["dim"], num_heads=hf["n_heads"], mlp_dim=hf["hidden_dim"],
      max_len=hf.get("max_position_embeddings", 512), position_embedding="learned",
      activation=ACTIVATIONS[act], norm="layernorm", norm_position="post", norm_eps=NORM_EPS,
      dropout_rate=hf.get("dropout", 0.1),
      attention_dropout_rate=hf.get("attention_dropout", 0.1),
      initializer_range=hf.get("initializer_range", 0.02), family="distilbert")
  fields.update(overrides)
  return EncoderConfig.from_dict(fields)


def hf_config(cfg: EncoderConfig) -> dict[str, Any]:
  """DistilBertConfig fields of an EncoderConfig; raises if DistilBERT cannot express it."""
  bert.check_bert_compatible(cfg, "DistilBERT", type_vocab_size=0, norm_eps=NORM_EPS,
                             pooler_dense=False)
  if cfg.activation not in ACTIVATIONS:
    raise ValueError(f"activation={cfg.activation!r} has no DistilBERT equivalent "
                     f"({sorted(ACTIVATIONS)})")
  return {"model_type": "distilbert", "vocab_size": cfg.vocab_size, "dim": cfg.emb_dim,
          "n_layers": cfg.num_layers, "n_heads": cfg.num_heads,
          "hidden_dim": cfg.resolved_mlp_dim, "activation": cfg.activation,
          "dropout": cfg.dropout_rate, "attention_dropout": cfg.attention_dropout_rate,
          "max_position_embeddings": cfg.max_len, "initializer_range": cfg.initializer_range,
          "sinusoidal_pos_embds": False, "pad_token_id": 0}


def encoder_slots(cfg: EncoderConfig, *, pooler: bool = False,
                  prefix: str = "") -> list[bert.Slot]:
  """Slots of DistilBertModel, names after `prefix`, looped layout."""
  del pooler  # DistilBERT has none
  d, f = cfg.emb_dim, cfg.resolved_mlp_dim
  h, k = cfg.num_heads, cfg.resolved_head_dim
  slots = bert.embedding_slots(cfg, "embeddings.LayerNorm")
  for i in range(cfg.num_layers):
    hf, ours = f"transformer.layer.{i}", layer_name(i)
    for name, our_name in (("q_lin", "query"), ("k_lin", "key"), ("v_lin", "value")):
      slots += bert.dense_slots(f"{hf}.attention.{name}", (ours, "attention", our_name), (d,),
                                (h, k))
    slots += bert.dense_slots(f"{hf}.attention.out_lin", (ours, "attention", "out"), (h, k), (d,))
    slots += bert.norm_slots(f"{hf}.sa_layer_norm", (ours, "attention_norm"), d)
    slots += bert.dense_slots(f"{hf}.ffn.lin1", (ours, "ffn", "wi"), (d,), (f,))
    slots += bert.dense_slots(f"{hf}.ffn.lin2", (ours, "ffn", "wo"), (f,), (d,))
    slots += bert.norm_slots(f"{hf}.output_layer_norm", (ours, "ffn_norm"), d)
  return [dataclasses.replace(s, hf_name=prefix + s.hf_name) for s in slots]


def mlm_head_slots(cfg: EncoderConfig) -> list[bert.Slot]:
  return bert.mlm_slots(cfg, "vocab_transform", "vocab_layer_norm", "vocab_projector.bias")


def tied(prefix: str) -> dict[str, str]:
  return {"vocab_projector.weight": prefix + "embeddings.word_embeddings.weight"}


LAYOUT = bert.Layout(
    family="distilbert", architecture="DistilBertModel", prefix=PREFIX,
    encoder_config=encoder_config, hf_config=hf_config, encoder_slots=encoder_slots,
    heads=(bert.Head("mlm_head", "vocab_", "DistilBertForMaskedLM", mlm_head_slots, tied),),
    buffers=("embeddings.position_ids",), pooler=False)
