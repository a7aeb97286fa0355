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
  text_records tasks: their keys in their task's module (jaxencoder/tasks/);
                  example_index [B] int32 when asked
A short final batch (finite epochs, drop_remainder=False) is filled with
all-padding rows (masks and weights 0) so that every batch has shape [B, ...].

Sharding: every process shuffles the same global order (same seed) and reads only
its rows of each global batch: with b rows per process and n processes, global
batch k holds elements k*b*n .. k*b*n + b*n - 1, and process p reads the b of them
at offset p*b (disjoint, complete). So the global batches, MLM masks included
(seeded by global index), are the same for any number of processes. The shard
defaults to jax.process_index() / jax.process_count().

Workers: every pipeline is a random-access dataset of whole batches (batch k is a pure
function of k), read through `workers` grain processes (`mp_prefetch`; 0 reads in the
caller). Worker w makes batches w, w + n, ...; they come back in order, so the batches
are the same for any number of workers, and the iterator's state resumes exactly.
Packing is the one stateful step: it runs after the workers, in the caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import grain
import jax
import numpy as np
from absl import flags
from grain import experimental as grain_exp

from jaxencoder.data import mlm as mlm_lib
from jaxencoder.data import mixture, packing, pooled_packing, token_ids
from jaxencoder.data.readers import DataError, as_text, check_not_empty

TEXT_KEYS = ("input_ids", "token_type_ids")
MLM_KEYS = ("input_ids", "token_type_ids", "mlm_labels", "mlm_weights")


@dataclasses.dataclass(frozen=True)
class Reading:
  """How any pipeline reads its source, whatever the data kind."""
  seed: int | None = 0  # shuffle (and augmentation / masking draws); None: keep order
  num_epochs: int | None = 1  # None: endless
  shard_index: int | None = None  # this process's shard; None: jax.process_index()
  shard_count: int | None = None  # None: jax.process_count()
  drop_remainder: bool = False  # drop a final partial batch (else: filled with zero rows)
  num_threads: int = 0  # grain read threads (0: read in the caller; n: read ahead, read_options)
  workers: int = 0  # grain processes making the batches (0: in the caller)


@dataclasses.dataclass(frozen=True)
class TextInput:
  """Where a text pipeline's tokens come from: `record[key]` tokenised, or the token ids
  stored beside the records (data/token_ids.py) where there are some and `stored_ids`."""
  key: str = "text"
  stored_ids: bool = True  # False: tokenise even where the source stores ids


@dataclasses.dataclass(frozen=True)
class PackSizes:
  """How much a packing mode sees at once (None: its default from the batch size)."""
  examples: int | None = None  # sequences packed together ("pack"), documents read a chunk
                               # at a time ("best_fit"); default 4 x batch_size
  pool_rows: int | None = None  # "best_fit": rows' worth of tokens pooled; default
                                # max(4 x batch_size, 64)


def _shard(shard_index, shard_count) -> tuple[int, int]:
  if shard_index is None or shard_count is None:
    shard_index, shard_count = jax.process_index(), jax.process_count()
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"shard_index {shard_index} not in [0, {shard_count})")
  return shard_index, shard_count


def examples(source, *, seed: int | None = 0, num_epochs: int | None = 1) -> grain.MapDataset:
  """All of `source` (a sequence or MapDataset), shuffled by `seed` (None: keep order),
  repeated; shard with `shard`."""
  ds = source if isinstance(source, grain.MapDataset) else grain.MapDataset.source(source)
  if seed is not None:
    ds = ds.shuffle(seed=seed)
  return ds.repeat(num_epochs)


def global_index(i, rows: int, index: int, count: int):
  """Element i of process `index`'s shard (of `count`) → its index in the global order:
  the process reads `rows` of every global batch of rows * count, at offset index * rows."""
  return (i // rows) * rows * count + index * rows + i % rows


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
  total = len(ds)
  def element(i):
    i = int(global_index(i, rows, index, count))
    return ds[i] if i < total else {**ds[0], FILL: True}
  return grain.MapDataset.range(-(-total // (rows * count)) * rows).map(element)


def tokenize_fn(tokenizer, seq_len: int, text_key: str = "text", text_b_key: str | None = None):
  """Example → unpadded 1-D `input_ids`, `token_type_ids`, `word_ids` (truncated to seq_len)."""
  def fn(ex):
    text_b = as_text(ex[text_b_key]) if text_b_key and len(ex[text_b_key]) else None
    enc = tokenizer.encode(as_text(ex[text_key]), text_b, max_length=seq_len)
    check_not_empty(enc["word_ids"][None], [ex])
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
  """0 threads reads in the caller's thread: fastest on small hosts (2 cores here) from
  local disk. n threads read ahead: they make the next 2n elements (chunks or batches)
  while this one is used, which hides an object store's latency; at most 2n are held."""
  return grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=max(1, 2 * num_threads))


def in_workers(batches: grain.MapDataset, num_threads: int = 0,
               workers: int = 0) -> grain.IterDataset:
  """Iterates a dataset of whole batches, made by `workers` processes (0: in the caller)."""
  it = batches.to_iter_dataset(read_options(num_threads))
  if workers > 0:
    # grain's workers read its absl flags: defaults outside an app
    if not flags.FLAGS.is_parsed():
      flags.FLAGS.mark_as_parsed()
    it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers,
                                                     per_worker_buffer_size=2))
  return it


def batches(ds: grain.MapDataset, batch_size: int, read: Reading) -> grain.IterDataset:
  """Per-example `ds` → this process's batches, made in `read.workers` processes."""
  ds = shard(ds, batch_size, read.shard_index, read.shard_count)
  batched = ds.batch(batch_size, drop_remainder=read.drop_remainder,
                     batch_fn=stack_fill(batch_size))
  return in_workers(batched, read.num_threads, read.workers)


def _batch(ds: grain.IterDataset, batch_size: int, drop_remainder: bool) -> grain.IterDataset:
  return ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=stack_fill(batch_size))


def chunk_indices(total: int, rows: int, *, drop_remainder: bool = False,
                  shard_index: int | None = None,
                  shard_count: int | None = None) -> grain.MapDataset:
  """Chunk k: the global element indices [rows] of this process's rows of global batch k
  (`rows` per process); -1 past `total` (fill rows). `drop_remainder` drops a final
  partial global batch."""
  index, count = _shard(shard_index, shard_count)
  block = rows * count
  num = total // block if drop_remainder else -(-total // block)
  def element(k):
    e_R = global_index(int(k) * rows + np.arange(rows, dtype=np.int64), rows, index, count)
    return np.where(e_R < total, e_R, -1)
  return grain.MapDataset.range(num).map(element)


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


def id_limits(model_cfg) -> dict[str, tuple[int, str]]:
  """What `check_ids` holds text batches to: the model's embedding tables."""
  vocab = (model_cfg.vocab_size, "model.vocab_size")
  limits = {key: vocab for key in ("input_ids", "mlm_labels", "decoder_input_ids", "target_ids")}
  if model_cfg.type_vocab_size:
    limits["token_type_ids"] = (model_cfg.type_vocab_size, "model.type_vocab_size")
  return limits


def default_mask(tokenizer, **fields) -> mlm_lib.MaskSpec:
  """BERT's 15% / 80-10-10 over the tokenizer's vocab; `fields` override MaskSpec's."""
  return mlm_lib.MaskSpec(tokenizer.vocab_size, tokenizer.mask_id,
                          tuple(int(i) for i in tokenizer.special_ids), **fields)


def read_examples(source, indices) -> list:
  """Examples `indices` of `source`, in one read where the source can (`__getitems__`)."""
  read = getattr(source, "__getitems__", None)
  return list(read(indices)) if read else [source[i] for i in indices]


def text_rows(source, stored, index_N: np.ndarray, tokenizer, seq_len: int,
              text_key: str = "text") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`input_ids`, `word_ids` [N, seq_len] and lengths [N] of `source`'s examples
  `index_N`: gathered from `stored` (`token_ids.stored(source, ...)`) when not None,
  else tokenised."""
  if stored is None:
    return token_ids.encode_rows(read_examples(source, index_N.tolist()), tokenizer, seq_len,
                                 text_key)
  ids, records = stored
  return ids.rows(index_N if records is None else records(index_N), seq_len, tokenizer.pad_id)


def text_reader(source, tokenizer, read: Reading, text: TextInput = TextInput()):
  """(order, rows) of a text source or a `mixture.Mixture`: `order[e]` is what global
  element e reads (shuffled by read.seed, repeated read.num_epochs times), and
  `rows(picks, seq_len)` the `input_ids`, `word_ids` [N, seq_len] and lengths [N] of
  N of them, from stored token ids where the source has them (and `text.stored_ids`)."""
  if isinstance(source, mixture.Mixture):
    stored = source.stored(tokenizer) if text.stored_ids else [None] * len(source.members)
    def rows(picks, seq_len):
      return source.text_rows(picks, lambda k, records_M: text_rows(
          source.members[k], stored[k], records_M, tokenizer, seq_len, text.key))
    return source.order(read.seed, read.num_epochs), rows
  stored = token_ids.stored(source, tokenizer) if text.stored_ids else None
  order = examples(grain.MapDataset.range(len(source)), seed=read.seed,
                   num_epochs=read.num_epochs)
  return order, lambda picks, seq_len: text_rows(source, stored, np.asarray(picks, np.int64),
                                                 tokenizer, seq_len, text.key)


def mlm_pipeline(source, tokenizer, *, seq_len: int, batch_size: int, mode: str = "pad",
                 mask: mlm_lib.MaskSpec | None = None, sizes: PackSizes = PackSizes(),
                 text: TextInput = TextInput(), rate_schedule: Sequence[tuple[int, float]] = (),
                 read: Reading = Reading()) -> grain.IterDataset:
  """Masked-LM batches from a text source; `mode` "pad", "pack" or "best_fit" (segment_ids,
  positions; packing.MODES).

  Whole chunks of examples are read, tokenised (or their stored ids taken: `token_ids`),
  masked (`mlm.mask_batch`, draws keyed by each example's global index) and padded, or
  packed (`packing.pack_rows`, `sizes.examples` sequences at a time, default 4 x
  batch_size), with numpy, in `read.workers` processes. `mask` defaults to BERT's 15% /
  80-10-10 over the tokenizer's vocab; pass `MaskSpec(..., rate=0.0)` for plain tokens.
  `text`: the records' text field, and whether stored token ids stand in for it.

  "best_fit": the workers read each chunk's documents (`sizes.examples` of them) whole
  (`packing.whole_documents`) and cut one longer than seq_len into pieces of seq_len
  tokens (`packing.piece_lengths`; its first piece keeps [CLS], its last [SEP], the ones
  between have neither: no token is added or lost); this process packs pools of at least
  `sizes.pool_rows` rows' worth of tokens (default max(4 x batch_size, 64)) by best fit
  (data/pooled_packing.py).

  `rate_schedule` ((k, rate), ...; `mlm.scheduled_rate`): batch k (0-based) on is masked
  at `rate` (`mask.rate` before the first point). The chunks carry the rate-free
  `mlm.mask_plan` (3 int32 [R, L] arrays in place of mlm_weights) and the iterator's last
  stage applies the rate by its batch count, which its state holds: batch k has the same
  masks after any restore. The trainer consumes batch k at train step k.
  """
  if mode not in packing.MODES:
    raise ValueError(f"mode must be one of {', '.join(map(repr, packing.MODES))}, got {mode!r}")
  mask = mask or default_mask(tokenizer)
  masking = mlm_lib.mask_plan if rate_schedule else mlm_lib.mask_batch
  order, text_rows_of = text_reader(source, tokenizer, read, text)
  pad_id = tokenizer.pad_id
  chunk_rows = batch_size if mode == "pad" else (sizes.examples or 4 * batch_size)

  def masked_rows(e_N, width):
    """Rows `width` wide of global elements e_N, masked; their lengths."""
    ids_NxW, words_NxW, lengths_N = text_rows_of([order[int(e)] for e in e_N], width)
    draws = mlm_lib.counter_uniforms(read.seed or 0, e_N, width)
    return masking(ids_NxW, mask, draws, words_NxW), lengths_N

  def chunk(e_R):
    real_R = e_R >= 0
    if mode == "best_fit":  # whole documents, first read 257 wide: a short one costs little
      tokens, lengths_N = packing.whole_documents(masked_rows, e_R[real_R], min(seq_len, 256) + 1)
      return {"tokens": tokens, "lengths": packing.piece_lengths(lengths_N, seq_len)}
    out, lengths_N = masked_rows(e_R[real_R], seq_len)
    if mode == "pad":
      return _padded_rows(out, lengths_N, real_R, seq_len)
    # [R, L] arrays: a few large ones cross from a worker cheaply
    return _filled(packing.pack_rows(out, lengths_N, seq_len), pad_id)

  chunks = chunk_indices(len(order), chunk_rows,
                         drop_remainder=read.drop_remainder and mode == "pad",
                         shard_index=read.shard_index, shard_count=read.shard_count).map(chunk)
  it = in_workers(chunks, read.num_threads, read.workers)
  if mode == "pack":
    rows = grain_exp.FlatMapIterDataset(it, _Unchunk(max_fan_out=chunk_rows))
    it = _batch(rows, batch_size, read.drop_remainder)
  if mode == "best_fit":
    pool_tokens = (sizes.pool_rows or max(4 * batch_size, 64)) * seq_len
    rows = pooled_packing.BestFitRows(it, seq_len, pool_tokens, lambda r: _filled(r, pad_id))
    it = _batch(rows, batch_size, read.drop_remainder)
  if not rate_schedule:
    return it
  return it.map_with_index(lambda k, plan: mlm_lib.apply_rate(
      plan, mlm_lib.scheduled_rate(rate_schedule, k, mask.rate)))


def _filled(packed: dict, pad_id: int) -> dict:
  """Packed MLM rows with the pad id in empty slots and token_type_ids (all 0)."""
  packed["input_ids"][packed["attention_mask"] == 0] = pad_id
  packed["token_type_ids"] = np.zeros_like(packed["input_ids"])
  return packed


class _Unchunk(grain_exp.FlatMapTransform):
  """A chunk's packed [R, L] arrays → its R rows, one element each."""

  def __init__(self, max_fan_out: int):
    self.max_fan_out = max_fan_out

  def flat_map(self, rows):
    return [{k: v[r] for k, v in rows.items()} for r in range(len(rows["input_ids"]))]


def _padded_rows(masked: dict, lengths_N, real_R, seq_len: int) -> dict:
  """[R, L] MLM batch (every key of `masked`, mlm_labels 0 on padding): the N real rows
  where `real_R`, all-zero fill rows elsewhere."""
  real_NxL = np.arange(seq_len)[None, :] < lengths_N[:, None]
  rows = {**masked, "mlm_labels": np.where(real_NxL, masked["mlm_labels"], 0),
          "attention_mask": real_NxL.astype(np.int32), "segment_ids": real_NxL.astype(np.int32),
          "positions": np.where(real_NxL, np.arange(seq_len), 0).astype(np.int32)}
  out = {}
  for k, v in rows.items():
    out[k] = np.zeros((len(real_R), seq_len), v.dtype)
    out[k][real_R] = v
  out["token_type_ids"] = np.zeros((len(real_R), seq_len), np.int32)
  return out


def classification_pipeline(source, tokenizer, *, seq_len: int, batch_size: int,
                            text_key: str = "text", text_b_key: str | None = "text_b",
                            label_key: str = "label",
                            read: Reading = Reading()) -> grain.IterDataset:
  """Sequence(-pair) classification: padded token batches plus `labels` [B]."""
  ds = examples(source, seed=read.seed, num_epochs=read.num_epochs)
  tok = tokenize_fn(tokenizer, seq_len, text_key, text_b_key)

  def features(ex):
    out = tok(ex)
    row = packing.pad_example(out, seq_len, TEXT_KEYS, tokenizer.pad_id)
    return {**{k: row[k] for k in packing_keys()}, "labels": np.int32(ex[label_key]),
            "example_weights": np.float32(1.0)}

  return batches(ds.map(features), batch_size, read)


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
                     read: Reading = Reading()) -> grain.IterDataset:
  """Word-level tagging (`words`, `tags`): labels on first sub-words, weight 0 elsewhere.

  Words cut off by truncation to `seq_len` get no label (weight 0).
  """
  ds = examples(source, seed=read.seed, num_epochs=read.num_epochs)

  def features(ex):
    words = [as_text(w) for w in ex["words"]]
    enc = tokenizer.encode(words, max_length=seq_len, padding="max_length",
                           is_pretokenized=True)
    labels_L, weights_L = align_word_labels(enc["first_subword_index"], ex["tags"], seq_len)
    row = packing.pad_example({k: enc[k][enc["attention_mask"] > 0] for k in TEXT_KEYS},
                              seq_len, TEXT_KEYS, tokenizer.pad_id)
    return {**{k: row[k] for k in packing_keys()}, "labels": labels_L,
            "label_weights": weights_L}

  return batches(ds.map(features), batch_size, read)


def records_pipeline(source, features, *, batch_size: int, index_examples: bool = False,
                     read: Reading = Reading()) -> grain.IterDataset:
  """text_records batches of `features(example)` (a task's record features:
  jaxencoder/tasks/); `index_examples` adds `example_index` [B], each row's place in
  `source`."""
  ds = grain.MapDataset.source(source)
  if index_examples:
    ds = ds.map_with_index(lambda i, ex: {**ex, "example_index": i})
  if read.seed is not None:
    ds = ds.shuffle(seed=read.seed)
  ds = ds.repeat(read.num_epochs).map(features)
  return batches(ds, batch_size, read)


IMAGES_IN_MEMORY = 1 << 30  # bytes of uint8 pixels


def image_pipeline(source, *, batch_size: int, mean: float = 0.5, std: float = 0.5,
                   random_flip: bool = False, random_shift: int = 0,
                   read: Reading = Reading()) -> grain.IterDataset:
  """uint8 `image` [H, W(, C)] → `images` float32 [B, H, W, C] = (x/255 - mean) / std.

  A split of at most IMAGES_IN_MEMORY bytes of pixels (Fashion-MNIST's 60k: 47 MB) is
  read into memory on first use, a larger one a batch at a time; batches are normalised
  with numpy. Augmentation (train):
  `random_flip` mirrors half the images left-right; `random_shift` moves each by up to
  that many pixels along each axis (vacated pixels 0, i.e. black); the draws are keyed by
  each example's global index (`mlm.counter_uniforms`), so batches do not depend on the
  worker or process count.
  """
  order = examples(np.arange(len(source)), seed=read.seed, num_epochs=read.num_epochs)
  held = {}  # "split": (images [N, H, W(, C)] uint8, labels [N]) if it fits, else None

  def stack(rows):
    return (np.stack([np.asarray(r["image"]) for r in rows]),
            np.array([r["label"] for r in rows], np.int32))

  def read_pixels(index_N):
    if "split" not in held:  # decided once, on the first batch
      fits = len(source) * np.asarray(source[0]["image"]).nbytes <= IMAGES_IN_MEMORY
      held["split"] = stack([r for i in range(0, len(source), 4096) for r in read_examples(
          source, list(range(i, min(i + 4096, len(source)))))]) if fits else None
    if held["split"] is None:
      return stack(read_examples(source, index_N.tolist()))
    images, labels = held["split"]
    return images[index_N], labels[index_N]

  def chunk(e_R):
    real_R = e_R >= 0
    pixels_N, labels_N = read_pixels(np.array([order[int(e)] for e in e_R[real_R]], np.int64))
    x_NxHxWxC = pixels_N.astype(np.float32) / 255.0
    if x_NxHxWxC.ndim == 3:
      x_NxHxWxC = x_NxHxWxC[..., None]
    if random_flip or random_shift:
      draws = mlm_lib.counter_uniforms(read.seed or 0, e_R[real_R], 3)
      x_NxHxWxC = augment_images(x_NxHxWxC, draws, random_flip, random_shift)
    images = np.zeros((len(e_R),) + x_NxHxWxC.shape[1:], np.float32)
    images[real_R] = (x_NxHxWxC - mean) / std
    labels = np.zeros(len(e_R), np.int32)
    labels[real_R] = labels_N
    return {"images": images, "labels": labels, "example_weights": real_R.astype(np.float32)}

  chunks = chunk_indices(len(order), batch_size, drop_remainder=read.drop_remainder,
                         shard_index=read.shard_index, shard_count=read.shard_count)
  return in_workers(chunks.map(chunk), read.num_threads, read.workers)


def augment_images(x_NxHxWxC: np.ndarray, uniforms: mlm_lib.Uniforms, flip: bool,
                   shift: int) -> np.ndarray:
  """Per image: a left-right mirror with probability 1/2 (`flip`, draw 0), then a shift
  by up to `shift` pixels along each axis (draws 1, 2), vacated pixels 0."""
  u_Nx3 = uniforms(0)
  if flip:
    mirror_N = u_Nx3[:, 0] < 0.5
    x_NxHxWxC = np.where(mirror_N[:, None, None, None], x_NxHxWxC[:, :, ::-1], x_NxHxWxC)
  if not shift:
    return x_NxHxWxC
  n, h, w = x_NxHxWxC.shape[:3]
  dy_N, dx_N = (np.floor(u_Nx3[:, 1:] * (2 * shift + 1)).astype(np.int64) - shift).T
  padded = np.pad(x_NxHxWxC, ((0, 0), (shift, shift), (shift, shift), (0, 0)))
  out = np.empty_like(x_NxHxWxC)
  for i in range(n):
    out[i] = padded[i, shift - dy_N[i]: shift - dy_N[i] + h, shift - dx_N[i]: shift - dx_N[i] + w]
  return out


def series_pipeline(source, *, length: int, batch_size: int, random_shift: int = 0,
                    random_scale: float = 0.0, read: Reading = Reading()) -> grain.IterDataset:
  """`series` [L_i, F] → `inputs` [length, F] (missing values → 0, masked) + mask.

  Augmentation (train): `random_shift` moves each series by up to that many steps
  (vacated steps are masked out, steps moved past the end dropped); `random_scale`
  multiplies it by a factor in [1 - s, 1 + s]."""
  ds = examples(source, seed=read.seed, num_epochs=read.num_epochs)

  def features(ex, rng=None):
    s_LxF = np.asarray(ex["series"], np.float32)
    if len(s_LxF) > length:
      raise DataError(f"{as_text(ex.get('origin', b'?'))}: series of {len(s_LxF)} steps > "
                      f"length={length}")
    x_LxF = np.zeros((length, s_LxF.shape[1]), np.float32)
    x_LxF[: len(s_LxF)] = np.nan_to_num(s_LxF)
    mask_L = np.zeros(length, np.int32)
    mask_L[: len(s_LxF)] = ~np.isnan(s_LxF).any(axis=1)
    if rng is not None:
      x_LxF, mask_L = augment_series(x_LxF, mask_L, rng, random_shift, random_scale)
    return {"inputs": x_LxF, "attention_mask": mask_L, "labels": np.int32(ex["label"]),
            "example_weights": np.float32(1.0)}

  ds = (ds.random_map(features, seed=read.seed or 0) if random_shift or random_scale
        else ds.map(features))
  return batches(ds, batch_size, read)


def augment_series(x_LxF: np.ndarray, mask_L: np.ndarray, rng: np.random.Generator,
                   shift: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
  """A shift by up to `shift` steps either way (vacated steps 0 and masked), then a
  scale by a factor drawn from [1 - scale, 1 + scale]."""
  if shift:
    d = int(rng.integers(-shift, shift + 1))
    x_LxF, mask_L = np.roll(x_LxF, d, axis=0), np.roll(mask_L, d)
    if d > 0:
      x_LxF[:d], mask_L[:d] = 0, 0
    elif d < 0:
      x_LxF[d:], mask_L[d:] = 0, 0
  if scale:
    x_LxF = x_LxF * np.float32(rng.uniform(1 - scale, 1 + scale))
  return x_LxF, mask_L
