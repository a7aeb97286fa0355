"""Pretrained Hugging Face checkpoints <-> jaxencoder, and sentence embeddings.

  cfg, params, tokenizer = load(HF_DIR)              # config.json + model.safetensors
  save(OUT_DIR, cfg, params, tokenizer)              # from_pretrained reads it
  vectors_NxD = embed(["a sentence", ...], HF_DIR)   # as sentence-transformers

`load` dispatches on config.json's model_type, `save` on cfg.family (FAMILY_MODULES):
bert (BertModel, BertForMaskedLM), roberta (RobertaModel, RobertaForMaskedLM;
positions offset past the pad id, byte-level BPE tokenizer), distilbert
(DistilBertModel, DistilBertForMaskedLM), electra (ElectraModel; ElectraForPreTraining
-> the discriminator head of jaxencoder.model.electra; ElectraForMaskedLM, a generator).

Convert for `train.py --config.init_from=DIR` (and back):
  python -m jaxencoder.pretrained convert --from HF_DIR --to DIR [--scan_layers]
  python -m jaxencoder.pretrained convert --from DIR --to HF_DIR
"""

from jaxencoder._lazy import lazy_exports

# Public name -> its module, imported on first use (PEP 562): `jaxencoder-convert --help`
# loads no JAX.
_MODULE_OF = {"load": "hf_checkpoint", "save": "hf_checkpoint", "embed": "sentences",
              "encoder_params": "hf_checkpoint", "params_from_tensors": "hf_checkpoint",
              "tensors_from_params": "hf_checkpoint", "FAMILY_MODULES": "hf_checkpoint"}
__all__ = list(_MODULE_OF)
__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF, globals())
