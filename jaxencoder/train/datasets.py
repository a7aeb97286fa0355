"""Train and eval input pipelines for a training config: the task's, else the data
kind's (the pure data side is jaxencoder/data/: kinds/, splits.py; no model here)."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Callable

import grain
import jax
import ml_collections

from jaxencoder.data import fingerprints, kinds, pipeline, records, sources, token_ids
from jaxencoder.data.readers import DataError
from jaxencoder.data.splits import (check_model_fits, check_sizes, label_names, load_tokenizer,
                                    local_batch_size, num_threads, open_mixture, open_splits,
                                    resolve_source, tokenizer_path)
from jaxencoder.io.paths import as_path
from jaxencoder.tasks import registry
from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path
from jaxencoder.train.config import base_config, rows_per_step

log = logging.getLogger("jaxencoder")


@dataclasses.dataclass
class Pipelines:
  """`train`: an endless IterDataset; `make_eval()` / `make_test()`: a fresh one-epoch
  IterDataset of the eval / test split (`make_test` None without data.test_split)."""
  train: grain.IterDataset
  make_eval: Callable[[], grain.IterDataset]
  label_names: list[str] | None  # the classes / tags, in order (None: no labels)
  tokenizer: Tokenizer | None
  train_workers: int = 0  # processes making the train batches (their state's layout)
  make_test: Callable[[], grain.IterDataset] | None = None
  # {"train" | "eval" | "test": the fingerprint of each prepared split read (data/fingerprints)}
  fingerprints: dict[str, list[dict]] = dataclasses.field(default_factory=dict)

  @property
  def num_classes(self) -> int | None:
    return None if self.label_names is None else len(self.label_names)


def vocab_from_tokenizer(config: ml_collections.ConfigDict) -> None:
  """A text model trained from scratch gets the tokenizer's size as model.vocab_size unless
  the user set it (`--config.model.vocab_size` / override_model, or a config value other
  than the base one); a table set larger than the tokenizer is noted. A smaller one fails
  in loop.build_task (tokenizer.check_fits). init_from keeps the checkpoint's table."""
  if config.init_from or not kinds.kind_of(config.data.kind).text:
    return
  if not (config.data.tokenizer or default_tokenizer_path()):
    return  # make_pipelines names the missing tokenizer
  tokens, rows = load_tokenizer(config.data).vocab_size, config.model.vocab_size
  if "vocab_size" not in config.model_overrides and rows == base_config().model.vocab_size:
    config.model.vocab_size = tokens
    log.info("model.vocab_size = %d, the tokenizer's size", tokens)
  elif rows > tokens:
    log.info("model.vocab_size=%d is larger than the tokenizer's %d tokens: %d rows of the "
             "embedding table are never read", rows, tokens, rows - tokens)


def check_classes(config, name: str, names: list[str] | None = None) -> None:
  """A DataError for a dataset that names fewer classes than its task learns from (the
  family's `min_classes`): one class trains to loss 0 and accuracy 1 and learns nothing.
  `names`: the dataset's label names, if read already."""
  task, family = registry.owner(config)
  needed = family.min_classes.get(task)
  if needed and names is None:
    names = label_names(config.data, name)
  if names is None or len(names) >= needed:
    return
  named = f" ({', '.join(map(repr, names))})" if names else ""
  listed = (", or a labels.txt beside its source files naming every class"
            if kinds.kind_of(config.data.kind).text else "")
  raise DataError(f"{name}: its labels name {len(names)} class{'es' * (len(names) != 1)}"
                  f"{named}; task={task} needs {needed} or more to learn anything: add "
                  f"examples of another class{listed}, and prepare it again")


def make_pipelines(config: ml_collections.ConfigDict, tokenizer_file: str | None = None
                   ) -> Pipelines:
  """Builds the pipelines the task and data kind call for; text batches are range-checked
  against the model's vocabularies. `tokenizer_file`: the tokenizer to read text with
  (a resumed run's own copy), instead of data.tokenizer."""
  data_cfg = config.data
  tokenizer_file = tokenizer_file or (tokenizer_path(data_cfg)
                                      if kinds.kind_of(data_cfg.kind).text else None)
  tokenizer = tokenizer_file if stores_token_ids(config) else None
  if data_cfg.sources:
    train_src, eval_src, name = open_mixture(data_cfg, tokenizer,
                                             config.num_train_steps * rows_per_step(config))
  else:
    name = resolve_source(data_cfg, tokenizer)
    train_src, eval_src = open_splits(data_cfg, name)
    check_sizes(data_cfg, name, train_src, eval_src)
    check_model_fits(config, name, train_src)
  tok = Tokenizer.from_file(tokenizer_file) if tokenizer_file else None
  names = label_names(data_cfg, name)
  check_classes(config, name, names)
  num_classes = None if names is None else len(names)

  train_workers = num_workers(config, train_src, tok)

  def build(src, batch_size, num_epochs, train):
    ds = _pipeline(config, tok, src, batch_size=local_batch_size(batch_size),
                   num_epochs=num_epochs, train=train, num_classes=num_classes,
                   workers=train_workers if train else 0)
    if tok is None:
      return ds
    if not config.model.type_vocab_size:  # no type table (DistilBERT, ModernBERT): no types
      ds = ds.map(lambda batch: {k: v for k, v in batch.items() if k != "token_type_ids"})
    return pipeline.check_ids(ds, pipeline.id_limits(config.model),
                              f"tokenizer {tokenizer_file} on {name}")

  make_test, read = None, {"train": train_src, "eval": eval_src}
  test_src = open_test(data_cfg, name)
  if test_src is not None:
    make_test = lambda: build(test_src, config.eval_batch_size, 1, False)  # noqa: E731
    read["test"] = test_src
  return Pipelines(build(train_src, rows_per_step(config), None, True),
                   lambda: build(eval_src, config.eval_batch_size, 1, False),
                   names, tok, train_workers, make_test,
                   fingerprints={role: fingerprints.split_fingerprints(src)
                                 for role, src in read.items()})


def train_examples(config) -> int:
  """The train split's size as this run reads it (after any held-out part): what one
  epoch (num_train_epochs) counts. Each example is one row of a batch; a text corpus has
  no such count (documents are cut or packed into rows), nor a mixture: refused."""
  data_cfg = config.data
  if kinds.kind_of(data_cfg.kind).corpus or data_cfg.sources:
    raise ValueError(f"num_train_epochs counts examples read one a row; data.kind="
                     f"{data_cfg.kind} cuts and packs documents into rows, so an epoch has "
                     "no fixed step count: set num_train_steps instead")
  name = resolve_source(data_cfg)
  train_src, eval_src = open_splits(data_cfg, name)
  check_sizes(data_cfg, name, train_src, eval_src)
  return len(train_src)


def open_test(data_cfg, name: str):
  """data.test_split's source; None without one, or (warned) for a dataset with a train
  split only (a config's `test` on the user's one file); another missing split: an error."""
  if not data_cfg.test_split:
    return None
  tfds_dir = as_path(data_cfg.data_dir) / "tfds"
  splits = sources.split_names(name, tfds_dir)
  if data_cfg.test_split in splits:
    return sources.open_source(name, data_cfg.test_split, tfds_dir)
  if splits != ["train"]:
    raise DataError(f"{name}: no split {data_cfg.test_split!r} to test on (has "
                    f"{', '.join(splits)}): set --config.data.test_split to one of them, or ''")
  log.warning("%s: no split %r, only train: no test score at the end (data.test_split='' "
              "says so)", name, data_cfg.test_split)
  return None


def stores_token_ids(config) -> bool:
  """Whether the task reads a text_corpus as stored token ids (its family decides:
  jaxencoder/tasks/base.Family.stores_token_ids)."""
  name, family = registry.owner(config)
  return family.stores_token_ids(name, config)


def num_workers(config, src, tok) -> int:
  """data.workers, or for -1: 0 when the step runs on the CPU (it needs the cores) or the
  batches gather stored token ids (one process makes 0.7-1M tokens/s, more than workers
  hand over: bench/input_pipeline.py), else min(16, cores // 2)."""
  if config.data.workers >= 0:
    return config.data.workers
  if jax.default_backend() == "cpu":
    return 0
  if stores_token_ids(config) and token_ids.stored(src, tok) is not None:
    return 0
  return max(1, min(16, (os.cpu_count() or 2) // 2))


def _pipeline(config, tok, src, *, batch_size, num_epochs, train, num_classes=None,
              workers: int = 0) -> grain.IterDataset:
  """The task's pipeline over `src` (its family decides; by default the data kind's:
  train: packed if so configured, drops a short last batch of an MLM stream, made by
  data.workers processes; eval: every example once, a short last batch filled,
  text_records rows numbered for metrics that rank the whole split, made in this
  process)."""
  name, family = registry.owner(config)
  kind = kinds.kind_of(config.data.kind)
  read = pipeline.Reading(seed=config.seed, num_epochs=num_epochs,
                          num_threads=num_threads(config, src), workers=workers)
  features = record_features(config, tok, num_classes) if kind.records else None
  return family.pipeline(name, config, src, tok, train=train, batch_size=batch_size,
                         read=read, kind=kind, features=features)


def record_features(config, tok, num_classes: int | None) -> Callable[[dict], dict]:
  """The task's arrays of each example of a `records` kind (text_records), checked for the
  columns it reads."""
  name, family = registry.owner(config)
  if name not in family.record_columns:
    raise DataError(f"data.kind={config.data.kind} serves the tasks "
                    f"{', '.join(registry.record_tasks())}; not task={name!r}")
  make = family.record_features(name, tok, config.data.seq_len, num_labels=num_classes)
  return records.checked(make, family.record_columns[name], name)


# Moved to the data layer (issue 43): the old spelling fails, naming the new one.
MOVED = {"Subset": "jaxencoder.data.splits.Subset", "Holdout": "jaxencoder.data.splits.Holdout",
         "READ_AHEAD_THREADS": "jaxencoder.data.splits.READ_AHEAD_THREADS",
         "on_object_store": "jaxencoder.data.splits.on_object_store",
         "id_limits": "jaxencoder.data.pipeline.id_limits",
         "TEXT_KINDS": "jaxencoder.data.kinds.kind_of(NAME).text"}


def __getattr__(name: str):
  if name in MOVED:
    raise ImportError(f"jaxencoder.train.datasets.{name} has moved: use {MOVED[name]}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
