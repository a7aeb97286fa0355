"""Per-layer features of a data set: hidden states of every layer, pooled per word or sentence.

Sentences run in fixed [batch_size, L] batches, L one of a few length buckets
(16, 32, 64, 128 …), so the jitted forward compiles once per bucket, not per length.
Pooling is a [B, W, L] weight matrix built on the host (first sub-word, mean of
sub-words, [CLS] or mean of tokens) and applied in the same jitted call, which also
accumulates the attention statistics of `attention_stats`. Features go to per-layer
`.npy` memmaps when `out_dir` is given (large sets), else to memory.
Images take `probing.images` instead (same `Features`, one item per image).
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxencoder import progress as progress_lib
from jaxencoder.model.config import EncoderConfig
from jaxencoder.data import readers
from jaxencoder.model.encoder import Encoder
from jaxencoder.probing import attention_stats, store
from jaxencoder.tokenizer import check_fits

WORD_POOLS = ("first", "mean")
SENTENCE_POOLS = ("cls", "mean")


@dataclasses.dataclass
class Dataset:
  """Sentences with labels: per word (`level="word"`) or per sentence."""
  level: str  # "word" | "sentence"
  sentences: list  # word: list of word lists; sentence: list of texts
  labels: list  # word: list of tag lists; sentence: list of labels
  origin: str = ""  # the file or directory read (plot titles name it)


@dataclasses.dataclass
class Features:
  """Pooled hidden states of M items (words or sentences) for each of N + 1 layers."""
  layers: list[np.ndarray]  # N + 1 of [M, D] (np.memmap when streamed)
  labels_M: np.ndarray  # int32 index into label_names
  label_names: list[str]
  sentence_ids_M: np.ndarray  # which sentence each item comes from (for splits)
  types: list[str] | None  # word string per item (word level), for control tasks
  attention: dict[str, np.ndarray] | None  # stat -> [N, H] means over real queries
  info: dict  # buckets, compiles, dropped (truncated) words …


SENTENCE_SUFFIXES = (".csv", ".tsv")  # text,label rows
WORD_SUFFIXES = (".txt", ".conllu")  # word/TAG lines, CoNLL-U
ACCEPTED = "word/TAG .txt, .conllu, or .csv/.tsv text,label files"


def read_dataset(path, *, max_sentences: int | None = None,
                 columns: readers.Columns | None = None) -> Dataset:
  """`.csv`/`.tsv` → sentence labels (columns by header name, see readers.Columns);
  anything else (`word/TAG`, `.conllu`) → word tags. A directory: its files of one kind
  (*.txt and *.conllu, or *.csv and *.tsv), in name order, as one data set."""
  path = pathlib.Path(path)
  files = data_files(path) if path.is_dir() else [path]
  level = "sentence" if files[0].suffix.lower() in SENTENCE_SUFFIXES else "word"
  sentences, labels = [], []
  for file in files:
    if level == "sentence":
      rows = readers.read_classification(file, columns=columns or readers.Columns())
      pairs = ((r["text"], r["label"]) for r in rows)
    else:
      pairs = ((r["words"], r["tags"]) for r in readers.read_tagged(file))
    for sentence, label in pairs:
      if max_sentences is not None and len(sentences) >= max_sentences:
        break
      sentences.append(sentence)
      labels.append(label)
  return Dataset(level, sentences, labels, str(path))


def data_files(directory: pathlib.Path) -> list[pathlib.Path]:
  """The data files of a --data directory (one kind: word tags or sentence labels)."""
  files = sorted(f for f in directory.iterdir() if f.is_file()
                 and f.suffix.lower() in WORD_SUFFIXES + SENTENCE_SUFFIXES)
  kinds = {f.suffix.lower() in SENTENCE_SUFFIXES for f in files}
  if not files:
    raise ValueError(f"--data {directory}: a directory needs {ACCEPTED} (none found)")
  if len(kinds) > 1:
    raise ValueError(f"--data {directory}: mixes word tags (.txt/.conllu) and sentence "
                     "labels (.csv/.tsv); keep one kind per directory")
  return files


def length_buckets(max_length: int, smallest: int = 16) -> tuple[int, ...]:
  """Powers of two from `smallest` below `max_length`, then `max_length` itself."""
  buckets, size = [], smallest
  while size < max_length:
    buckets.append(size)
    size *= 2
  return tuple(buckets) + (max_length,)


def bucket_for(length: int, buckets: Sequence[int]) -> int:
  for size in buckets:
    if length <= size:
      return size
  raise ValueError(f"length {length} exceeds the largest bucket {buckets[-1]}")


def plan_batches(lengths: np.ndarray, batch_size: int, buckets: Sequence[int]
                 ) -> list[tuple[int, np.ndarray]]:
  """[(bucket, sentence indices)]: length-sorted chunks of at most `batch_size`."""
  order = np.argsort(lengths, kind="stable")
  plan = []
  for start in range(0, len(order), batch_size):
    rows = order[start:start + batch_size]
    plan.append((bucket_for(int(lengths[rows].max()), buckets), rows))
  return plan


def pooling_weights(batch: dict[str, np.ndarray], level: str, pool: str,
                    width: int) -> np.ndarray:
  """[B, W, L] float32 weights; pooled[b, w] = sum_l weights[b, w, l] * h[b, l].

  word: W = `width` word slots (first sub-word one-hot, or sub-word mean);
  sentence: W = 1 ([CLS] one-hot, or mean over real tokens).
  """
  mask_BxL = batch["attention_mask"].astype(np.float32)
  length = mask_BxL.shape[1]
  if level == "sentence":
    if pool == "cls":
      return np.broadcast_to(np.eye(length, dtype=np.float32)[:1][None],
                             (mask_BxL.shape[0], 1, length)).copy()
    return (mask_BxL / np.maximum(mask_BxL.sum(1, keepdims=True), 1.0))[:, None, :]
  slots_1xWx1 = np.arange(width)[None, :, None]
  if pool == "first":
    first_BxW = _pad_columns(batch["first_subword_index"], width, -1)
    return (first_BxW[:, :, None] == np.arange(length)[None, None, :]).astype(np.float32)
  member_BxWxL = (batch["word_ids"][:, None, :] == slots_1xWx1) & (
      batch["token_type_ids"][:, None, :] == 0)
  member_BxWxL = member_BxWxL.astype(np.float32)
  return member_BxWxL / np.maximum(member_BxWxL.sum(-1, keepdims=True), 1.0)


def _pad_columns(x_BxK: np.ndarray, width: int, value: int) -> np.ndarray:
  out = np.full((x_BxK.shape[0], width), value, x_BxK.dtype)
  out[:, :min(width, x_BxK.shape[1])] = x_BxK[:, :width]
  return out


def _pad_rows(batch: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
  """Appends all-padding rows up to `rows` (fixed batch shape); pads are ignored."""
  def pad(x):
    extra = np.zeros((rows - x.shape[0],) + x.shape[1:], x.dtype)
    return np.concatenate([x, extra])
  return {k: pad(v) for k, v in batch.items()}


class Extractor:
  """Jitted forward: pooled hidden states of all layers (+ attention sums) per batch.

  `traces` counts how often the forward was traced (= compiled): once per
  distinct [batch_size, bucket] shape.
  """

  def __init__(self, cfg: EncoderConfig, params, *, attention: bool = True,
               sparsity_threshold: float = 0.1):
    self.cfg, self.params = cfg, params
    self.attention = attention and cfg.attention_impl != "linear"
    self.sparsity_threshold = sparsity_threshold
    self.traces = 0
    self.forward = jax.jit(self._forward)

  def _forward(self, params, batch, weights_BxWxL, groups):
    self.traces += 1  # Python side effect: runs at trace time only
    types_BxL = batch["token_type_ids"] if self.cfg.type_vocab_size else None
    out = Encoder(self.cfg).apply(
        {"params": params}, batch["input_ids"], attention_mask=batch["attention_mask"],
        token_type_ids=types_BxL, output_hidden_states=True,
        output_attentions=self.attention)
    h_NxBxLxD = jnp.stack(out.hidden_states).astype(jnp.float32)
    pooled_NxBxWxD = jnp.einsum("nbld,bwl->nbwd", h_NxBxLxD, weights_BxWxL)
    if not self.attention:
      return pooled_NxBxWxD, None
    sums = [attention_stats.head_sums(p.astype(jnp.float32), batch["attention_mask"], groups,
                                      self.sparsity_threshold) for p in out.attentions]
    return pooled_NxBxWxD, {k: jnp.stack([s[k] for s in sums]) for k in sums[0]}

  def __call__(self, batch: dict[str, np.ndarray], weights_BxWxL: np.ndarray,
               groups: dict[str, np.ndarray]):
    model_inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    pooled, sums = self.forward(self.params, model_inputs, weights_BxWxL, groups)
    return np.asarray(pooled), None if sums is None else jax.device_get(sums)


def encode(tokenizer, dataset: Dataset, rows, *, max_length: int, pad_to: int | None = None):
  """Tokenizer batch for the sentences at `rows` (pre-split words at word level)."""
  return tokenizer.encode_batch([dataset.sentences[i] for i in rows], max_length=max_length,
                                pad_to=pad_to, is_pretokenized=dataset.level == "word")


def measure(tokenizer, dataset: Dataset, max_length: int, chunk: int = 512):
  """(token length [S], items kept [S]) per sentence after truncation to `max_length`."""
  lengths, kept = [], []
  for start in range(0, len(dataset.sentences), chunk):
    batch = encode(tokenizer, dataset, range(start, min(start + chunk, len(dataset.sentences))),
                   max_length=max_length)
    lengths.append(batch["attention_mask"].sum(1))
    kept.append((batch["first_subword_index"] >= 0).sum(1) if dataset.level == "word"
                else np.ones(len(batch["input_ids"]), np.int64))
  return np.concatenate(lengths), np.concatenate(kept)


def extract(cfg: EncoderConfig, params, tokenizer, dataset: Dataset, *, pool: str | None = None,
            batch_size: int = 32, max_length: int = 128, out_dir=None, progress: bool = True,
            extractor: Extractor | None = None) -> Features:
  """Pooled features of every layer for `dataset` (+ attention means per layer and head).

  pool: "first" (default) or "mean" sub-word at word level; "cls" (default) or "mean"
  at sentence level. Words cut by truncation to `max_length` are dropped (counted in
  `info["dropped_items"]`); batches are padded to `length_buckets(max_length)`. With
  `out_dir`, layer n goes to `out_dir/layer_NN.npy`. `progress`: a bar (or plain lines)
  over the batches, on stderr. `extractor`: one built for `cfg`, with its attention
  settings (`Extractor(cfg, params, attention=False)`: no attention statistics; its
  `sparsity_threshold`), or to reuse its compiled forward (e.g. for many checkpoints of a
  run): it is set to run `params`; `info["compiles"]` counts its traces.
  """
  pool = pool or ("first" if dataset.level == "word" else "cls")
  allowed = WORD_POOLS if dataset.level == "word" else SENTENCE_POOLS
  if pool not in allowed:
    raise ValueError(f"pool={pool!r} at {dataset.level} level; choose from {allowed}")
  if not dataset.sentences:
    raise ValueError("extract: the dataset has no sentences")
  if cfg.input_kind != "text":
    raise ValueError(f"probing features need a text encoder, got input_kind={cfg.input_kind!r}"
                     " (image encoders: probing.images, --data DIR or .npz)")
  check_fits(tokenizer, cfg, "probing features")
  max_length = min(max_length, cfg.max_positions)
  buckets = length_buckets(max_length)
  lengths_S, kept_S = measure(tokenizer, dataset, max_length)
  layers = store.allocate(cfg.num_layers + 1, int(kept_S.sum()), cfg.emb_dim, out_dir)
  extractor = _ready(extractor, cfg, params)
  totals = _run_batches(extractor, tokenizer, dataset, layers, pool,
                        plan_batches(lengths_S, batch_size, buckets), kept_S,
                        batch_size=batch_size, max_length=max_length, progress=progress)
  labels_M, names = _label_ids(dataset, kept_S)
  info = {"level": dataset.level, "pool": pool, "buckets": list(buckets),
          "compiles": extractor.traces, "sentences": len(dataset.sentences),
          "items": int(kept_S.sum()), "dropped_items": _dropped(dataset, kept_S)}
  feats = Features(layers, labels_M, names, np.repeat(np.arange(len(kept_S)), kept_S),
                   _types(dataset, kept_S),
                   None if totals is None else attention_stats.head_means(totals), info)
  if out_dir is not None:
    store.save(feats, out_dir)
  return feats


def _ready(extractor: Extractor | None, cfg: EncoderConfig, params) -> Extractor:
  """A new Extractor, or `extractor` (built for `cfg`) set to run `params`."""
  if extractor is None:
    return Extractor(cfg, params)
  if extractor.cfg != cfg:
    raise ValueError("extract: the extractor was built for another model config")
  extractor.params = params
  return extractor


def _run_batches(extractor: Extractor, tokenizer, dataset: Dataset, layers, pool: str,
                 plan, kept_S, *, batch_size: int, max_length: int, progress: bool = True):
  """Runs every batch of `plan` (plan_batches), writes its items into `layers`; returns
  attention sums."""
  offsets_S = np.concatenate([[0], np.cumsum(kept_S)[:-1]]).astype(np.int64)
  punct_V = attention_stats.punctuation_table(tokenizer)
  totals = None
  for bucket, rows in progress_lib.track(plan, extracting_desc(len(layers)), unit="batch",
                                         enabled=progress):
    batch = encode(tokenizer, dataset, rows, max_length=max_length, pad_to=bucket)
    weights_BxWxL = pooling_weights(batch, dataset.level, pool,
                                    bucket if dataset.level == "word" else 1)
    groups = attention_stats.token_groups(batch["input_ids"], tokenizer, punct_V)
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    pooled_NxBxWxD, sums = extractor(_pad_rows(inputs, batch_size),
                                     _pad_rows({"w": weights_BxWxL}, batch_size)["w"],
                                     _pad_rows(groups, batch_size))
    _write(layers, pooled_NxBxWxD, rows, kept_S, offsets_S)
    totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
  return totals


def extracting_desc(num_hidden: int) -> str:
  """'extracting layers 0-N' (0: the embeddings), the extraction bar's label."""
  return f"extracting layers 0-{num_hidden - 1}"


def _write(layers, pooled_NxBxWxD, rows, kept_S, offsets_S) -> None:
  for i, s in enumerate(rows):
    start, count = offsets_S[s], kept_S[s]
    for n, layer in enumerate(layers):
      layer[start:start + count] = pooled_NxBxWxD[n, i, :count]


def _label_ids(dataset: Dataset, kept_S: np.ndarray) -> tuple[np.ndarray, list[str]]:
  if dataset.level == "word":
    labels = [t for tags, k in zip(dataset.labels, kept_S) for t in tags[:k]]
  else:
    labels = list(dataset.labels)
  names = sorted(set(labels))
  index = {name: i for i, name in enumerate(names)}
  return np.array([index[t] for t in labels], np.int32), names


def _types(dataset: Dataset, kept_S: np.ndarray) -> list[str] | None:
  if dataset.level != "word":
    return None
  return [w for words, k in zip(dataset.sentences, kept_S) for w in words[:k]]


def _dropped(dataset: Dataset, kept_S: np.ndarray) -> int:
  if dataset.level != "word":
    return 0
  return int(sum(len(words) for words in dataset.sentences) - kept_S.sum())


def sentence_attention(cfg: EncoderConfig, params, tokenizer, text, *, max_length: int = 64
                       ) -> tuple[list[str], np.ndarray]:
  """(tokens, attention [N, H, T, T]) of one sentence (a text or a word list), T real tokens."""
  pretokenized = not isinstance(text, str)
  enc = tokenizer.encode(text, max_length=min(max_length, cfg.max_positions),
                         is_pretokenized=pretokenized)
  types = enc["token_type_ids"][None] if cfg.type_vocab_size else None
  out = jax.jit(Encoder(cfg).apply, static_argnames=("output_attentions",))(
      {"params": params}, enc["input_ids"][None], attention_mask=enc["attention_mask"][None],
      token_type_ids=types, output_attentions=True)
  tokens = [tokenizer.hf.id_to_token(int(i)) for i in enc["input_ids"]]
  return tokens, np.stack([np.asarray(p[0]) for p in out.attentions])


def load_features(out_dir) -> Features:
  """Features saved by `extract(..., out_dir=...)`, layers memory-mapped."""
  return Features(**store.load(out_dir))
