"""Pretrained Hugging Face checkpoints <-> jaxencoder, and sentence embeddings.

  cfg, params, tokenizer = load(HF_DIR)              # config.json + model.safetensors
  save(OUT_DIR, cfg, params, tokenizer)              # from_pretrained reads it
  vectors_NxD = embed(["a sentence", ...], HF_DIR)   # as sentence-transformers

`load` dispatches on config.json's model_type, `save` on cfg.family (FAMILIES):
bert (BertModel, BertForMaskedLM), roberta (RobertaModel, RobertaForMaskedLM;
positions offset past the pad id, byte-level BPE tokenizer), distilbert
(DistilBertModel, DistilBertForMaskedLM), electra (ElectraModel; ElectraForPreTraining
-> the discriminator head of jaxencoder.electra; ElectraForMaskedLM, a generator).

Convert for `train.py --config.init_from=DIR` (and back):
  python -m jaxencoder.pretrained convert --from HF_DIR --to DIR [--scan_layers]
  python -m jaxencoder.pretrained convert --from DIR --to HF_DIR
"""

from jaxencoder.pretrained.hf_checkpoint import (
    FAMILIES,
    encoder_params,
    load,
    params_from_tensors,
    save,
    tensors_from_params,
)
from jaxencoder.pretrained.sentences import embed

__all__ = ["load", "save", "embed", "encoder_params", "params_from_tensors",
           "tensors_from_params", "FAMILIES"]
