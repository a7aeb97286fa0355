"""Seq2seq examples from plain text: restore a sentence from its shuffled words.

Per document (a text_corpus paragraph) and epoch, a seeded draw picks one sentence of
`min_words`..`max_words` words (a sentence ends at . ! ? ; or :), else a run of
`max_words` consecutive words; the encoder reads its words in a seeded random order, the
decoder writes them in the original order. Documents shorter than `min_words` words give a
row with zero target weight. Batch keys (B batch, L = seq_len, T = L - 1):

  input_ids, attention_mask, token_type_ids [B, L]  `[CLS] shuffled words [SEP]`
  decoder_input_ids  [B, T] int32    `[CLS] words`: the targets shifted right ([CLS] = BOS)
  decoder_mask       [B, T] int32    1 on real decoder inputs
  target_ids         [B, T] int32    `words [SEP]` ([SEP] = EOS)
  target_weights     [B, T] float32  1.0 on real targets
"""

from __future__ import annotations

import re

import grain
import numpy as np

from jaxencoder.data import packing, pipeline
from jaxencoder.data.pipeline import Reading
from jaxencoder.data.readers import as_text

SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")
KEYS = ("input_ids", "attention_mask", "token_type_ids", "decoder_input_ids", "decoder_mask",
        "target_ids", "target_weights")


def pick_words(text: str, rng: np.random.Generator, min_words: int,
               max_words: int) -> list[str]:
  """A random sentence of min..max words; else a random run of max_words words."""
  fits = [w for s in SENTENCE_END.split(text) if min_words <= len(w := s.split()) <= max_words]
  if fits:
    return fits[rng.integers(len(fits))]
  words = text.split()
  start = rng.integers(max(len(words) - max_words, 0) + 1)
  return words[start:start + max_words]


def example(text: str, rng: np.random.Generator, tokenizer, *, seq_len: int, min_words: int,
            max_words: int) -> dict[str, np.ndarray]:
  """One row (see the module docstring): source and target padded to seq_len, seq_len - 1."""
  words = pick_words(text, rng, min_words, max_words)
  shuffled = [words[i] for i in rng.permutation(len(words))]
  source = tokenizer.encode(" ".join(shuffled), max_length=seq_len)
  target_ids = tokenizer.encode(" ".join(words), max_length=seq_len)["input_ids"]
  row = packing.pad_example({k: source[k] for k in pipeline.TEXT_KEYS}, seq_len,
                            pipeline.TEXT_KEYS, tokenizer.pad_id)
  length, real = seq_len - 1, len(target_ids) - 1
  weight = np.float32(len(words) >= min_words)
  pad = lambda ids: np.pad(np.asarray(ids, np.int32), (0, length - len(ids)),
                           constant_values=tokenizer.pad_id)
  mask_T = (np.arange(length) < real).astype(np.int32)
  return {"input_ids": row["input_ids"], "attention_mask": row["attention_mask"],
          "token_type_ids": row["token_type_ids"], "decoder_input_ids": pad(target_ids[:-1]),
          "decoder_mask": mask_T, "target_ids": pad(target_ids[1:]),
          "target_weights": mask_T.astype(np.float32) * weight}


def shuffled_words_pipeline(source, tokenizer, *, seq_len: int, batch_size: int,
                            min_words: int = 3, max_words: int = 10,
                            read: Reading = Reading()) -> grain.IterDataset:
  """Batches of shuffled-sentence rows (module docstring) from a text source: a fresh
  sentence and order per document and epoch, the same for the same seed."""
  if not 1 <= min_words <= max_words:
    raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")

  def row(ex, rng):
    text = as_text(ex["text"])
    return example(text, rng, tokenizer, seq_len=seq_len,
                   min_words=min_words, max_words=max_words)

  ds = pipeline.examples(source, seed=read.seed, num_epochs=read.num_epochs)
  return pipeline.batches(ds.random_map(row, seed=read.seed), batch_size, read)
