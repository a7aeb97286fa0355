"""grain pipelines: random-access source → shard → shuffle → features → static batches.

Every pipeline returns a `grain.IterDataset`; `iter(ds)` gives a
`grain.DatasetIterator` whose `get_state()` / `set_state()` checkpoint the
position exactly (the resumed iterator yields exactly the next batch).

Batch keys (dicts of numpy arrays; B batch, L length):
  input_ids       [B, L] int32   token ids (after MLM corruption when masking)
  attention_mask  [B, L] int32   1 = real token, 0 = padding
  token_type_ids  [B, L] int32   0 = `[CLS] a [SEP]`, 1 = `b [SEP]`
  segment_ids     [B, L] int32   packed: 1, 2, 3... per sequence, 0 = pad; padded: = mask
  positions       [B, L] int32   position within its own segment (restarts at 0)
  mlm_labels      [B, L] int32   original ids (MLM only)
  mlm_weights     [B, L] float32 1.0 where a token was chosen for prediction (MLM only)
  pair_labels     [B] int32      sentence pairs (data/pairs.py): 1 = swapped (SOP) or not next (NSP)
  labels          [B] int32 (sequence / image / series tasks) or [B, L] (token tasks)
  example_weights [B] float32   1.0 for real rows, 0.0 for fill rows (sequence / image / series)
  label_weights   [B, L] float32 token tasks: 1.0 on each word's first sub-word
  images          [B, H, W, C] float32 normalised
  inputs          [B, L, F] float32 time series (attention_mask [B, L] marks real steps)
  text_records tasks (span, multilabel, regression, multiple_choice, contrastive pairs):
                  their keys in data/records.py; example_index [B] int32 when asked
A short final batch (finite epochs, drop_remainder=False) is filled with
all-padding rows (masks and weights 0) so that every batch has shape [B, ...].

Sharding: every process shuffles the same global order (same seed) and reads only
its rows of each global batch: with b rows per process and n processes, global
batch k holds elements k*b*n .. k*b*n + b*n - 1, and process p reads the b of them
at offset p*b (disjoint, complete). So the global batches, MLM masks included
(seeded by global index), are the same for any number of processes. The shard
defaults to jax.process_index() / jax.process_count().
"""

from __future__ import annotations

from collections.abc import Sequence

import grain
import numpy as np

from jaxencoder.data import mlm as mlm_lib
from jaxencoder.data import packing, records
from jaxencoder.data.readers import DataError

TEXT_KEYS = ("input_ids", "token_type_ids")
MLM_KEYS = ("input_ids", "token_type_ids", "mlm_labels", "mlm_weights")


def _shard(shard_index, shard_count) -> tuple[int, int]:
  if shard_index is None or shard_count is None:
    import jax  # only the default needs jax
    shard_index, shard_count = jax.process_index(), jax.process_count()
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
  return shard_index, shard_count


def examples(source, *, seed: int | None = 0, num_epochs: int | None = 1) -> grain.MapDataset:
  """All of `source`, shuffled by `seed` (None: keep order), repeated; shard with `shard`."""
  ds = grain.MapDataset.source(source)
  if seed is not None:
    ds = ds.shuffle(seed=seed)
  return ds.repeat(num_epochs)


FILL = "_fill"  # marks a padding element that stack_fill turns into an all-zero row


def shard(ds: grain.MapDataset, rows: int, shard_index: int | None = None,
          shard_count: int | None = None) -> grain.MapDataset:
  """This process's `rows` of every global batch of `rows * shard_count` elements.

  A final partial global batch is completed with fill elements (zero rows), so
  every process yields the same number of batches.
  """
  index, count = _shard(shard_index, shard_count)
  if count == 1:
    return ds
  block = rows * count
  total = len(ds)
  def element(i):
    i = (int(i) // rows) * block + index * rows + int(i) % rows
    return ds[i] if i < total else {**ds[0], FILL: True}
  return grain.MapDataset.range(-(-total // block) * rows).map(element)


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def tokenize_fn(tokenizer, seq_len: int, text_key: str = "text", text_b_key: str | None = None):
  """Example → unpadded 1-D `input_ids`, `token_type_ids`, `word_ids` (truncated to seq_len)."""
  def fn(ex):
    text_b = _text(ex[text_b_key]) if text_b_key and len(ex[text_b_key]) else None
    enc = tokenizer.encode(_text(ex[text_key]), text_b, max_length=seq_len)
    if (enc["word_ids"] >= 0).sum() == 0:
      origin = _text(ex.get("origin", b"?"))
      raise DataError(f"{origin}: zero-length sequence (no tokens besides [CLS]/[SEP])")
    out = {k: v for k, v in ex.items() if k not in (text_key, text_b_key, "origin")}
    out.update(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"],
               word_ids=enc["word_ids"])
    return out
  return fn


def stack_fill(batch_size: int):
  """Stacks a list of examples into [B, ...], filling missing rows with zeros."""
  def fn(rows: Sequence[dict]) -> dict:
    out = {}
    real = np.array([not r.get(FILL, False) for r in rows])
    for k in (k for k in rows[0] if k != FILL):
      arr = np.stack([np.asarray(r[k]) for r in rows])
      arr[~real] = 0
      if len(rows) < batch_size:
        fill = np.zeros((batch_size - len(rows),) + arr.shape[1:], arr.dtype)
        arr = np.concatenate([arr, fill])
      out[k] = arr
    return out
  return fn


def read_options(num_threads: int) -> grain.ReadOptions:
  """0 threads reads in the caller's thread: fastest on small hosts (2 cores here)."""
  return grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=max(1, 64 * num_threads))


def _iter_batches(ds: grain.MapDataset, batch_size, drop_remainder, num_threads,
                  shard_index=None, shard_count=None):
  ds = shard(ds, batch_size, shard_index, shard_count)
  return _batch(ds.to_iter_dataset(read_options(num_threads)), batch_size, drop_remainder)


def _batch(ds: grain.IterDataset, batch_size: int, drop_remainder: bool) -> grain.IterDataset:
  return ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=stack_fill(batch_size))


def check_ids(ds: grain.IterDataset, limits: dict[str, tuple[int, str]],
              origin: str) -> grain.IterDataset:
  """`ds`, whose batches' ids must lie in [0, size) for `limits` {key: (size, its name)}.

  One min and max per key and batch (microseconds); an id outside is a DataError
  naming the id, where it sits, the size and `origin` (where the ids came from).
  """
  def check(batch):
    for key, (size, size_name) in limits.items():
      ids = batch.get(key)
      if ids is None:
        continue
      low, high = ids.min(), ids.max()
      if low < 0 or high >= size:
        bad = low if low < 0 else high
        where = ", ".join(str(int(i)) for i in np.argwhere(ids == bad)[0])
        raise DataError(f"{key}[{where}] = {bad} is outside [0, {size}) ({size_name}={size}); "
                        f"ids from {origin}")
    return batch
  return ds.map(check)


def mlm_pipeline(source, tokenizer, *, seq_len: int, batch_size: int, mode: str = "pad",
                 mask: mlm_lib.MaskSpec | None = None, seed: int = 0,
                 num_epochs: int | None = 1, shard_index: int | None = None,
                 shard_count: int | None = None, pack_bins: int | None = None,
                 drop_remainder: bool = False, num_threads: int = 0,
                 text_key: str = "text") -> grain.IterDataset:
  """Masked-LM batches from a text source; `mode` "pad" or "pack" (segment_ids, positions).

  `mask` defaults to BERT's 15% / 80-10-10 over the tokenizer's vocab; pass
  `MaskSpec(..., rate=0.0)` to get plain tokens.
  """
  if mode not in ("pad", "pack"):
    raise ValueError(f"mode must be 'pad' or 'pack', got {mode!r}")
  mask = mask or mlm_lib.MaskSpec(tokenizer.vocab_size, tokenizer.mask_id,
                                  tuple(int(i) for i in tokenizer.special_ids))
  ds = examples(source, seed=seed, num_epochs=num_epochs)
  ds = ds.map(tokenize_fn(tokenizer, seq_len, text_key))

  def corrupt(ex, rng):
    ex.update(mlm_lib.mask_tokens(ex["input_ids"], mask, rng, ex["word_ids"]))
    return {k: ex[k] for k in MLM_KEYS}

  ds = shard(ds.random_map(corrupt, seed=seed), batch_size, shard_index, shard_count)
  it = ds.to_iter_dataset(read_options(num_threads))
  if mode == "pack":
    it = packing.pack(it, seq_len, MLM_KEYS, num_bins=pack_bins or batch_size, seed=seed)
  else:
    it = it.map(lambda ex: packing.pad_example(ex, seq_len, MLM_KEYS, tokenizer.pad_id))
  return _batch(it, batch_size, drop_remainder)


def classification_pipeline(source, tokenizer, *, seq_len: int, batch_size: int,
                            seed: int | None = 0, num_epochs: int | None = 1,
                            shard_index=None, shard_count=None, drop_remainder: bool = False,
                            num_threads: int = 0, text_key: str = "text",
                            text_b_key: str | None = "text_b",
                            label_key: str = "label") -> grain.IterDataset:
  """Sequence(-pair) classification: padded token batches plus `labels` [B]."""
  ds = examples(source, seed=seed, num_epochs=num_epochs)
  tok = tokenize_fn(tokenizer, seq_len, text_key, text_b_key)

  def features(ex):
    out = tok(ex)
    row = packing.pad_example(out, seq_len, TEXT_KEYS, tokenizer.pad_id)
    return {**{k: row[k] for k in packing_keys()}, "labels": np.int32(ex[label_key]),
            "example_weights": np.float32(1.0)}

  return _iter_batches(ds.map(features), batch_size, drop_remainder, num_threads,
                       shard_index, shard_count)


def packing_keys() -> tuple[str, ...]:
  return ("input_ids", "token_type_ids", "attention_mask", "segment_ids", "positions")


def align_word_labels(first_subword_W: np.ndarray, tags_W: np.ndarray, length: int):
  """Word labels → token `labels` [L] on each word's first sub-word, `label_weights` [L]."""
  labels_L = np.zeros(length, np.int32)
  weights_L = np.zeros(length, np.float32)
  kept = first_subword_W >= 0
  labels_L[first_subword_W[kept]] = np.asarray(tags_W)[: len(first_subword_W)][kept]
  weights_L[first_subword_W[kept]] = 1.0
  return labels_L, weights_L


def tagging_pipeline(source, tokenizer, *, seq_len: int, batch_size: int,
                     seed: int | None = 0, num_epochs: int | None = 1, shard_index=None,
                     shard_count=None, drop_remainder: bool = False,
                     num_threads: int = 0) -> grain.IterDataset:
  """Word-level tagging (`words`, `tags`): labels on first sub-words, weight 0 elsewhere.

  Words cut off by truncation to `seq_len` get no label (weight 0).
  """
  ds = examples(source, seed=seed, num_epochs=num_epochs)

  def features(ex):
    words = [_text(w) for w in ex["words"]]
    enc = tokenizer.encode(words, max_length=seq_len, padding="max_length",
                           is_pretokenized=True)
    labels_L, weights_L = align_word_labels(enc["first_subword_index"], ex["tags"], seq_len)
    row = packing.pad_example({k: enc[k][enc["attention_mask"] > 0] for k in TEXT_KEYS},
                              seq_len, TEXT_KEYS, tokenizer.pad_id)
    return {**{k: row[k] for k in packing_keys()}, "labels": labels_L,
            "label_weights": weights_L}

  return _iter_batches(ds.map(features), batch_size, drop_remainder, num_threads,
                       shard_index, shard_count)


def records_pipeline(source, tokenizer, *, task: str, seq_len: int, batch_size: int,
                     num_labels: int | None = None, index_examples: bool = False,
                     seed: int | None = 0, num_epochs: int | None = 1, shard_index=None,
                     shard_count=None, drop_remainder: bool = False,
                     num_threads: int = 0) -> grain.IterDataset:
  """text_records batches for `task` (columns and arrays: data/records.py);
  `index_examples` adds `example_index` [B], each row's place in `source`."""
  ds = grain.MapDataset.source(source)
  if index_examples:
    ds = ds.map_with_index(lambda i, ex: {**ex, "example_index": i})
  if seed is not None:
    ds = ds.shuffle(seed=seed)
  ds = ds.repeat(num_epochs).map(records.features(task, tokenizer, seq_len,
                                                  num_labels=num_labels))
  return _iter_batches(ds, batch_size, drop_remainder, num_threads, shard_index, shard_count)


def image_pipeline(source, *, batch_size: int, mean: float = 0.5, std: float = 0.5,
                   seed: int | None = 0, num_epochs: int | None = 1, shard_index=None,
                   shard_count=None, drop_remainder: bool = False,
                   num_threads: int = 0) -> grain.IterDataset:
  """uint8 `image` [H, W(, C)] → `images` float32 [H, W, C] = (x/255 - mean) / std."""
  ds = examples(source, seed=seed, num_epochs=num_epochs)

  def features(ex):
    x = np.asarray(ex["image"], np.float32) / 255.0
    x_HxWxC = x[..., None] if x.ndim == 2 else x
    return {"images": (x_HxWxC - mean) / std, "labels": np.int32(ex["label"]),
            "example_weights": np.float32(1.0)}

  return _iter_batches(ds.map(features), batch_size, drop_remainder, num_threads,
                       shard_index, shard_count)


def series_pipeline(source, *, length: int, batch_size: int, seed: int | None = 0,
                    num_epochs: int | None = 1, shard_index=None, shard_count=None,
                    drop_remainder: bool = False,
                    num_threads: int = 0) -> grain.IterDataset:
  """`series` [L_i, F] → `inputs` [length, F] (missing values → 0, masked) + mask."""
  ds = examples(source, seed=seed, num_epochs=num_epochs)

  def features(ex):
    s_LxF = np.asarray(ex["series"], np.float32)
    if len(s_LxF) > length:
      raise DataError(f"{_text(ex.get('origin', b'?'))}: series of {len(s_LxF)} steps > "
                      f"length={length}")
    x_LxF = np.zeros((length, s_LxF.shape[1]), np.float32)
    x_LxF[: len(s_LxF)] = np.nan_to_num(s_LxF)
    mask_L = np.zeros(length, np.int32)
    mask_L[: len(s_LxF)] = ~np.isnan(s_LxF).any(axis=1)
    return {"inputs": x_LxF, "attention_mask": mask_L, "labels": np.int32(ex["label"]),
            "example_weights": np.float32(1.0)}

  return _iter_batches(ds.map(features), batch_size, drop_remainder, num_threads,
                       shard_index, shard_count)
