"""Two views of one text for contrastive training: its first and second half.

`halves_pipeline` reads a text corpus (stored token ids where the corpus has them) and
cuts each text's first 2 x seq_len - 2 tokens at the word boundary nearest their middle: `[CLS] first half [SEP]`
and `[CLS] second half [SEP]` are a positive pair (two adjacent spans of one speech, as
DeCLUTR's anchors and positives), the batch's other halves its negatives. A text of one
word gives the same span twice (then only dropout tells the views apart, as in SimCSE).
Rows: text arrays [B, 2, L] and `example_weights` [B] (0 for fill rows), the layout of
supervised contrastive groups (jaxencoder/tasks/contrastive.py).
"""

from __future__ import annotations

import grain
import numpy as np

from jaxencoder.data import pipeline
from jaxencoder.data.pipeline import Reading


def split_point(words_N: np.ndarray) -> int:
  """Where to cut n content tokens (their word ids `words_N`): the start of the word
  holding token n // 2, or n // 2 if that word starts the text; 0 for n < 2."""
  n = len(words_N)
  if n < 2:
    return 0
  mid = n // 2
  start = int(np.searchsorted(words_N, words_N[mid], "left"))  # word ids never decrease
  return start if start > 0 else mid


def halves(ids_NxT: np.ndarray, words_NxT: np.ndarray, lengths_N: np.ndarray, seq_len: int,
           cls_id: int, sep_id: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Rows `[CLS] tokens [SEP]` (T columns) → (`input_ids`, `attention_mask`) [N, 2, seq_len]:
  each row's first and second half, each cut to seq_len - 2 tokens."""
  n = len(ids_NxT)
  ids_Nx2xL = np.full((n, 2, seq_len), pad_id, np.int32)
  mask_Nx2xL = np.zeros((n, 2, seq_len), np.int32)
  for i in range(n):
    content, words = ids_NxT[i, 1:lengths_N[i] - 1], words_NxT[i, 1:lengths_N[i] - 1]
    cut = split_point(words)
    spans = (content[:cut], content[cut:]) if cut else (content, content)
    for v, span in enumerate(spans):
      row = np.concatenate([[cls_id], span[:seq_len - 2], [sep_id]])
      ids_Nx2xL[i, v, :len(row)] = row
      mask_Nx2xL[i, v, :len(row)] = 1
  return ids_Nx2xL, mask_Nx2xL


def halves_pipeline(source, tokenizer, *, seq_len: int, batch_size: int, text_key: str = "text",
                    read: Reading = Reading()) -> grain.IterDataset:
  """Batches of (first half, second half) pairs of `source`'s texts, [B, 2, seq_len]."""
  order, text_rows_of = pipeline.text_reader(source, tokenizer, read,
                                             pipeline.TextInput(key=text_key))
  read_len = 2 * seq_len  # room for two halves of seq_len - 2 tokens each

  def chunk(e_R):
    real_R = e_R >= 0
    rows = text_rows_of([order[int(e)] for e in e_R[real_R]], read_len)
    ids_Nx2xL, mask_Nx2xL = halves(*rows, seq_len, tokenizer.cls_id, tokenizer.sep_id,
                                   tokenizer.pad_id)
    out = {"input_ids": np.full((len(e_R), 2, seq_len), tokenizer.pad_id, np.int32),
           "attention_mask": np.zeros((len(e_R), 2, seq_len), np.int32)}
    out["input_ids"][real_R], out["attention_mask"][real_R] = ids_Nx2xL, mask_Nx2xL
    out["token_type_ids"] = np.zeros_like(out["input_ids"])
    out["segment_ids"] = out["attention_mask"].copy()
    out["positions"] = np.where(out["attention_mask"] > 0, np.arange(seq_len), 0).astype(np.int32)
    out["example_weights"] = real_R.astype(np.float32)
    return out

  chunks = pipeline.chunk_indices(len(order), batch_size, drop_remainder=read.drop_remainder,
                                  shard_index=read.shard_index,
                                  shard_count=read.shard_count).map(chunk)
  return pipeline.in_workers(chunks, read.num_threads, read.workers)
