"""text_corpus: documents of running text, unlabelled (a folder of .txt files, or a
prepared tfds dataset's texts). Its rows are plain tokens, packed or padded; the masked
tasks mask them at a rate (`masked_text_pipeline`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from jaxencoder.data.kinds.base import Kind, text_shapes

if TYPE_CHECKING:  # grain loads only where a pipeline is built
  from jaxencoder.data.pipeline import Reading


def mask_rate_schedule(data) -> tuple[tuple[int, float], ...]:
  """data.mask_rate_schedule as ((step, rate), ...); () when unset (stored configs from
  before the key included)."""
  return tuple((int(step), float(rate)) for step, rate in data.get("mask_rate_schedule") or ())


def masked_text_pipeline(config, tokenizer, source, *, train: bool, rate: float,
                         batch_size: int, read: Reading, scheduled: bool = False):
  """text_corpus batches: tokens BERT-masked at `rate` (0: plain tokens, no prediction
  targets chosen), packed or padded rows (eval: padded). `scheduled` (train): the rate
  follows data.mask_rate_schedule by train step; eval keeps `rate`, so eval losses
  compare across the run."""
  from jaxencoder.data import pipeline  # lazy: tasks import without grain
  data = config.data
  spec = pipeline.default_mask(tokenizer, rate=rate, whole_word=data.whole_word)
  schedule = mask_rate_schedule(data) if scheduled and train else ()
  return pipeline.mlm_pipeline(source, tokenizer, seq_len=data.seq_len,
                               mode=data.packing if train else "pad", mask=spec,
                               batch_size=batch_size, rate_schedule=schedule,
                               read=dataclasses.replace(read, drop_remainder=train))


class TextCorpusKind(Kind):
  name = "text_corpus"
  builder = "jaxencoder.data.builders.TextCorpus"
  options = {
      "packing": "pad",  # pad | pack | best_fit (data/packing.py MODES)
      "mask_rate": 0.15,
      # masked tasks, train batches: ((step, rate), ...), from train step `step` on (0-based,
      # as the LR schedule counts) mask at `rate`; data.mask_rate before the first point and
      # for eval (e.g. mmBERT's ((0, 0.3), (80000, 0.15), (95000, 0.05))); () = mask_rate
      "mask_rate_schedule": (),
      "whole_word": False,
      "min_words": 3,  # seq2seq: sentences of min_words..max_words words to restore
      "max_words": 10,
      # several sources in fixed proportions, "NAME:WEIGHT,..." (e.g.
      # "shakespeare:0.7,austen:0.3"; each NAME as data.source takes it); replaces
      # data.source; each is held out as data.eval_split says (data/mixture.py)
      "sources": "",
      # MLM: a fetched corpus stores its token ids once, at prepare (keyed to the
      # tokenizer); reading then does no tokenisation (data/token_ids.py).
      "tokenize_once": True,
  }
  text, corpus = True, True

  def pipeline(self, config, tokenizer, source, *, train, batch_size, read, features=None):
    """Plain tokens (the masked tasks mask them)."""
    return masked_text_pipeline(config, tokenizer, source, train=train, rate=0.0,
                                batch_size=batch_size, read=read)

  def batch_shapes(self, config, batch):
    L = config.data.seq_len
    return {**text_shapes((batch, L), config), "mlm_labels": ((batch, L), np.int32),
            "mlm_weights": ((batch, L), np.float32)}


KIND = TextCorpusKind()
