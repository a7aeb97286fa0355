"""Token ids of text examples: stored once by `prepare --tokenizer`, or made per chunk.

A text_corpus prepared with a tokenizer keeps, beside its array_record files, every
example's full encoding ([CLS]/[SEP] included, untruncated) as flat arrays:

  token_ids/<split>.ids.npy      int32 [T]    token ids of all examples, in record order
  token_ids/<split>.words.npy    int32 [T]    word index of each token (-1 on specials)
  token_ids/<split>.offsets.npy  int64 [N+1]  example i is [offsets[i], offsets[i+1])

and records the tokenizer's digest in fingerprint.json. Reading a chunk of rows is then
a gather from memory-mapped arrays: no record decoding, no tokenisation. A run whose
tokenizer has another digest gets a DataError instead of ids from the wrong vocabulary.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence

import numpy as np
from etils import epath

from jaxencoder.data.readers import DataError, as_text, check_not_empty

DIR = "token_ids"
FINGERPRINT = "fingerprint.json"
_ENCODE_BATCH = 1024  # texts per tokenizer call when writing


def tokenizer_digest(tokenizer) -> str:
  """sha256 of the tokenizer's definition (vocab, normaliser, specials, template), without
  its per-call truncation and padding settings."""
  definition = json.loads(tokenizer.hf.to_str())
  definition.pop("truncation", None)
  definition.pop("padding", None)
  return hashlib.sha256(json.dumps(definition, sort_keys=True).encode("utf-8")).hexdigest()


def write(dataset_dir, tokenizer, text_key: str = "text") -> None:
  """Tokenises every split of the prepared dataset at `dataset_dir` into token_ids/."""
  import tensorflow_datasets as tfds
  builder = tfds.builder_from_directory(str(dataset_dir))
  out = epath.Path(dataset_dir) / DIR
  out.mkdir(parents=True, exist_ok=True)
  for split in builder.info.splits:
    source = builder.as_data_source(split=split)
    ids, words, lengths = [], [], []
    for start in range(0, len(source), _ENCODE_BATCH):
      examples = source.__getitems__(range(start, min(start + _ENCODE_BATCH, len(source))))
      batch = tokenizer.encode_batch([as_text(ex[text_key]) for ex in examples])
      check_not_empty(batch["word_ids"], examples)
      n_B = batch["attention_mask"].sum(axis=1)
      real_BxL = batch["attention_mask"] > 0
      ids.append(batch["input_ids"][real_BxL])
      words.append(batch["word_ids"][real_BxL])
      lengths.append(n_B)
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lengths or [[]]))]).astype(np.int64)
    for name, array in (("ids", ids), ("words", words)):
      _save(out / f"{split}.{name}.npy", np.concatenate(array or [[]]).astype(np.int32))
    _save(out / f"{split}.offsets.npy", offsets)


def _save(path: epath.Path, array: np.ndarray) -> None:
  buffer = io.BytesIO()
  np.save(buffer, array)
  path.write_bytes(buffer.getvalue())


class StoredIds:
  """One split's stored token ids; `rows(indices, seq_len)` gathers padded rows.

  Opens its arrays on first use (memory-mapped when local), so that pickling it for a
  worker process copies a path, not the arrays.
  """

  def __init__(self, dataset_dir, split: str):
    self.dir, self.split = str(dataset_dir), split
    self._arrays = None

  def __getstate__(self):
    return {"dir": self.dir, "split": self.split, "_arrays": None}

  def _load(self, name: str) -> np.ndarray:
    path = epath.Path(self.dir) / DIR / f"{self.split}.{name}.npy"
    if not path.exists():
      raise DataError(f"{self.dir}: no stored token ids for split {self.split!r} ({path} "
                      "is missing): prepare it again with --tokenizer")
    if str(path).startswith("gs://"):  # no memory map on Cloud Storage: read it whole
      return np.load(io.BytesIO(path.read_bytes()))
    return np.load(str(path), mmap_mode="r")

  @property
  def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if self._arrays is None:
      self._arrays = tuple(self._load(n) for n in ("ids", "words", "offsets"))
    return self._arrays

  def __len__(self) -> int:
    return len(self.arrays[2]) - 1

  def rows(self, indices, seq_len: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`input_ids`, `word_ids` [B, seq_len] and lengths [B] of examples `indices`, each
    truncated as the tokenizer truncates one text: its first seq_len - 1 tokens and its
    last (the closing special)."""
    ids_T, words_T, offsets = self.arrays
    idx_B = np.asarray(indices, np.int64)
    start_B, end_B = offsets[idx_B], offsets[idx_B + 1]
    lengths_B = np.minimum(end_B - start_B, seq_len)
    col_L = np.arange(seq_len)
    src_BxL = np.where(col_L < lengths_B[:, None] - 1, start_B[:, None] + col_L, end_B[:, None] - 1)
    real_BxL = col_L < lengths_B[:, None]
    src_BxL = np.where(real_BxL, src_BxL, 0)
    ids_BxL = np.where(real_BxL, ids_T[src_BxL], pad_id).astype(np.int32)
    words_BxL = np.where(real_BxL, words_T[src_BxL], -1).astype(np.int32)
    return ids_BxL, words_BxL, lengths_B


def stored(source, tokenizer) -> tuple[StoredIds, np.ndarray | None] | None:
  """(the stored ids behind `source`, the record index of each of its examples, None for
  all in order); None when `source` stores no ids; ids made by another tokenizer are a
  DataError. `source` is a prepared split, or a view with `.source` and `.indices`."""
  indices = None
  while not hasattr(source, "dataset_info") and hasattr(source, "source"):
    view = np.asarray(source.indices)
    indices = view if indices is None else view[indices]
    source = source.source
  info = getattr(source, "dataset_info", None)
  data_dir = getattr(info, "data_dir", None)
  if data_dir is None or not (epath.Path(data_dir) / FINGERPRINT).exists():
    return None
  made_by = json.loads((epath.Path(data_dir) / FINGERPRINT).read_text()).get("tokenizer")
  if made_by is None:
    return None
  if made_by["sha256"] != tokenizer_digest(tokenizer):
    raise DataError(f"{data_dir} stores token ids made by the tokenizer {made_by['path']} "
                    f"(sha256 {made_by['sha256'][:12]}), not by this run's (sha256 "
                    f"{tokenizer_digest(tokenizer)[:12]}): prepare it again with this "
                    "tokenizer (--tokenizer), or set data.tokenizer to that one")
  return StoredIds(data_dir, str(source.split)), indices


def encode_rows(examples: Sequence[dict], tokenizer, seq_len: int,
                text_key: str = "text") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`input_ids`, `word_ids` [B, seq_len] (pad id / -1 after each row's end) and lengths
  [B] of `examples`' texts, in one batched tokenizer call."""
  batch = tokenizer.encode_batch([as_text(ex[text_key]) for ex in examples], max_length=seq_len,
                                 pad_to=seq_len)
  check_not_empty(batch["word_ids"], examples)
  return batch["input_ids"], batch["word_ids"], batch["attention_mask"].sum(axis=1)
