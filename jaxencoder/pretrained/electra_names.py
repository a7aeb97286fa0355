"""ELECTRA's Hugging Face names <-> jaxencoder params: BERT's, with E-wide embeddings.

ElectraModel's token / position / type tables and their LayerNorm are E =
embedding_size wide; `embeddings_project` (E -> hidden_size) follows when E differs,
our `embeddings/project` (cfg.embedding_dim). No pooler. Heads (prefix `electra.`):
ElectraForPreTraining's `discriminator_predictions` is our ELECTRA DiscriminatorHead
(jaxencoder.model.electra); ElectraForMaskedLM (a generator checkpoint) is our
EncoderForMaskedLM, its `generator_predictions` (always GELU) our MlmHead.
"""

from __future__ import annotations

from typing import Any, Mapping

from jaxencoder.model.config import EncoderConfig
from jaxencoder.pretrained import bert_names as bert

PREFIX = "electra."
DISCRIMINATOR_HEAD = "discriminator_head"  # jaxencoder.model.electra.Electra's attribute name


def encoder_config(hf: Mapping[str, Any], **overrides: Any) -> EncoderConfig:
  """EncoderConfig of an ElectraConfig dict (config.json)."""
  e = hf.get("embedding_size", hf["hidden_size"])
  fields = dict(embedding_dim=None if e == hf["hidden_size"] else e, family="electra",
                pooler_dense=False)
  return bert.encoder_config({**hf, "model_type": "bert"}, **{**fields, **overrides})


def hf_config(cfg: EncoderConfig) -> dict[str, Any]:
  """ElectraConfig fields of an EncoderConfig; raises if ELECTRA cannot express it."""
  bert.check_bert_compatible(cfg.replace(embedding_dim=None), "ELECTRA", pooler_dense=False)
  fields = bert.hf_config(cfg.replace(embedding_dim=None))
  return {**fields, "model_type": "electra",
          "embedding_size": cfg.embedding_dim or cfg.emb_dim}


def discriminator_slots(cfg: EncoderConfig) -> list[bert.Slot]:
  d = cfg.emb_dim
  return [*bert.dense_slots("discriminator_predictions.dense", ("transform",), (d,), (d,)),
          *bert.dense_slots("discriminator_predictions.dense_prediction", ("classifier",),
                            (d,), (1,))]


def generator_slots(cfg: EncoderConfig) -> list[bert.Slot]:
  return bert.mlm_slots(cfg, "generator_predictions.dense", "generator_predictions.LayerNorm",
                        "generator_lm_head.bias")


def generator_tied(prefix: str) -> dict[str, str]:
  return {"generator_lm_head.weight": prefix + "embeddings.word_embeddings.weight"}


LAYOUT = bert.Layout(
    family="electra", architecture="ElectraModel", prefix=PREFIX,
    encoder_config=encoder_config, hf_config=hf_config, encoder_slots=bert.encoder_slots,
    heads=(bert.Head(DISCRIMINATOR_HEAD, "discriminator_predictions.", "ElectraForPreTraining",
                     discriminator_slots, lambda prefix: {}),
           bert.Head("mlm_head", "generator_", "ElectraForMaskedLM", generator_slots,
                     generator_tied, activation="gelu")),
    # jaxencoder.model.electra's generator reads the discriminator's token table through its
    # own front end: no HF class holds it next to the discriminator, so save drops it.
    pooler=False, unsaved=("generator", "generator_head"))
