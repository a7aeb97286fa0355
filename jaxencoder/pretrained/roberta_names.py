"""RoBERTa's Hugging Face names <-> jaxencoder params: BERT's, plus offset positions.

RobertaModel numbers real tokens padding_idx + 1 + i (padding tokens read row
padding_idx), so position i reads table row `position_offset` + i with
position_offset = pad_token_id + 1; the table (max_position_embeddings rows)
round-trips as is. One token type. RobertaForMaskedLM: `roberta.` + `lm_head.*`,
whose activation is always GELU.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxencoder.model.config import EncoderConfig
from jaxencoder.pretrained import bert_names as bert

PREFIX = "roberta."
MLM_PREFIX = "lm_head."


def encoder_config(hf: Mapping[str, Any], **overrides: Any) -> EncoderConfig:
  """EncoderConfig of a RobertaConfig dict (config.json)."""
  pad_id = hf.get("pad_token_id", 1)
  fields = dict(position_offset=pad_id + 1, type_vocab_size=hf.get("type_vocab_size", 1),
                family="roberta")
  return bert.encoder_config({**hf, "model_type": "bert"}, **{**fields, **overrides})


def hf_config(cfg: EncoderConfig) -> dict[str, Any]:
  """RobertaConfig fields of an EncoderConfig; raises if RoBERTa cannot express it."""
  bert.check_bert_compatible(cfg, "RoBERTa", position_offset=max(cfg.position_offset, 1))
  fields = bert.hf_config(cfg.replace(position_offset=0))
  return {**fields, "model_type": "roberta", "pad_token_id": cfg.position_offset - 1,
          "bos_token_id": 0, "eos_token_id": 2}


def mlm_head_slots(cfg: EncoderConfig) -> list[bert.Slot]:
  return bert.mlm_slots(cfg, "lm_head.dense", "lm_head.layer_norm", "lm_head.bias")


def tied(prefix: str) -> dict[str, str]:
  return {"lm_head.decoder.weight": prefix + "embeddings.word_embeddings.weight",
          "lm_head.decoder.bias": "lm_head.bias"}


LAYOUT = bert.Layout(
    family="roberta", architecture="RobertaModel", prefix=PREFIX,
    encoder_config=encoder_config, hf_config=hf_config, encoder_slots=bert.encoder_slots,
    heads=(bert.Head("mlm_head", MLM_PREFIX, "RobertaForMaskedLM", mlm_head_slots, tied,
                     activation="gelu"),))
