"""Sentence pairs from consecutive segments of a text corpus: BERT's next-sentence
prediction (NSP) and ALBERT's sentence-order prediction (SOP).

`corpus_order` puts a prepared corpus's segments (paragraphs by default) in reading
order from each one's origin (`file:line`, or `file:line part k` for the parts of a
document too long to hold whole, which stay one document's consecutive segments). A pair
starts at a segment whose successor lies in the same file, and is, with equal odds:
  nsp   label 0: (a, its next segment)   label 1: (a, a random segment of another file)
  sop   label 0: (a, next), in order     label 1: (next, a), swapped
Rows are `[CLS] a [SEP] b [SEP]` (token types 0 then 1, both cut longest-first to fit),
BERT-masked like MLM rows, plus `pair_labels` [B] int32 and `example_weights` [B]
(0 for fill rows). The label draws are seeded per element, fresh each epoch.
"""

from __future__ import annotations

import re

import grain
import numpy as np

from jaxencoder.data import mlm as mlm_lib
from jaxencoder.data import packing, pipeline
from jaxencoder.data.pipeline import Reading
from jaxencoder.data.readers import DataError, as_text

OBJECTIVES = ("nsp", "sop")
_ORIGIN = re.compile(r"(.*):(\d+)(?: part (\d+))?")  # file, line, part


def corpus_order(source) -> tuple[np.ndarray, np.ndarray]:
  """(indices of `source` in reading order [N], each one's file number [N]), from the
  examples' `origin` ("file:line" or "file:line part k"); one batched read where the
  source allows it."""
  indices = list(range(len(source)))
  examples = pipeline.read_examples(source, indices)
  keys = []
  for i, ex in enumerate(examples):
    origin = as_text(ex["origin"])
    where = _ORIGIN.fullmatch(origin)
    if where:
      keys.append((where[1], int(where[2]), int(where[3] or 1), i))
    else:  # no line number: an origin of its own
      keys.append((origin, 0, 0, i))
  keys.sort()
  order = np.array([key[-1] for key in keys], np.int64)
  _, files = np.unique([key[0] for key in keys], return_inverse=True)
  return order, files.astype(np.int64)


class PairMaker:
  """Builds pair `k` (the k-th start, in reading order) of `source` for `objective`."""

  def __init__(self, source, objective: str):
    if objective not in OBJECTIVES:
      raise ValueError(f"sentence-pair objective must be one of {OBJECTIVES}, got {objective!r}")
    self.source, self.objective = source, objective
    self.order, self.files = corpus_order(source)
    self.starts = np.flatnonzero(self.files[:-1] == self.files[1:])
    if not len(self.starts):
      raise DataError("no two consecutive segments in one file: nothing to pair "
                      f"({len(source)} segments)")
    # Segments of file f are order[file_lo[f]:file_hi[f]] (the order is sorted by file).
    self.file_lo = np.searchsorted(self.files, np.arange(self.files[-1] + 1), "left")
    self.file_hi = np.searchsorted(self.files, np.arange(self.files[-1] + 1), "right")

  def __len__(self) -> int:
    return len(self.starts)

  def __call__(self, k: int, rng: np.random.Generator) -> dict:
    at = int(self.starts[k])
    first, second = self.order[at], self.order[at + 1]
    label = int(rng.random() < 0.5)
    if label and self.objective == "sop":
      first, second = second, first
    elif label:
      second = self.order[self._elsewhere(at, rng)]
    a, b = self.source[int(first)], self.source[int(second)]
    return {"text": a["text"], "text_b": b["text"], "origin": a.get("origin", b"?"),
            "pair_labels": np.int32(label)}

  def _elsewhere(self, at: int, rng: np.random.Generator) -> int:
    """A uniform position outside the file of position `at` (outside the pair itself
    when the corpus is one file)."""
    lo, hi = self.file_lo[self.files[at]], self.file_hi[self.files[at]]
    if hi - lo == len(self.order):
      lo, hi = at, at + 2
    if hi - lo == len(self.order):
      raise DataError("nsp needs a segment outside the pair: the corpus has only two")
    j = int(rng.integers(len(self.order) - (hi - lo)))
    return j + (hi - lo) * (j >= lo)


def pair_word_ids(word_ids_L: np.ndarray, token_type_ids_L: np.ndarray) -> np.ndarray:
  """Word ids unique across the pair (the tokenizer restarts them for text b), so
  whole-word masking never joins a word of `a` with one of `b`."""
  shift = int(word_ids_L.max()) + 1
  return np.where((token_type_ids_L == 1) & (word_ids_L >= 0), word_ids_L + shift, word_ids_L)


def pair_pipeline(source, tokenizer, objective: str, *, seq_len: int, batch_size: int,
                  mask: mlm_lib.MaskSpec, read: Reading = Reading()) -> grain.IterDataset:
  """Masked sentence-pair batches (padded; see the module docstring) from a text corpus."""
  maker = PairMaker(source, objective)
  tokenize = pipeline.tokenize_fn(tokenizer, seq_len, "text", "text_b")

  def row(k, rng):
    ex = tokenize(maker(int(k), rng))
    word_ids = pair_word_ids(ex["word_ids"], ex["token_type_ids"])
    ex.update(mlm_lib.mask_tokens(ex["input_ids"], mask, rng, word_ids))
    padded = packing.pad_example({key: ex[key] for key in pipeline.MLM_KEYS}, seq_len,
                                 pipeline.MLM_KEYS, tokenizer.pad_id)
    return {**padded, "pair_labels": ex["pair_labels"], "example_weights": np.float32(1.0)}

  ds = pipeline.examples(np.arange(len(maker)), seed=read.seed, num_epochs=read.num_epochs)
  return pipeline.batches(ds.random_map(row, seed=read.seed), batch_size, read)

