"""What `init_from` brings into a training config: the architecture stored with that
checkpoint (`adopt`; `model.*` overrides and the run-time fields stay, LoRA's among them),
its tokenizer, and its encoder params (`restore_base`: a LoRA run's adapters merged in).
`init_from` may also be a Hugging Face directory or `minilm`: converted once into
data_dir/pretrained/ (`pretrained_run_dir`).
"""

from __future__ import annotations

import hashlib
import json
import logging

import jax
import ml_collections

from jaxencoder.model import lora
from jaxencoder.model.config import EncoderConfig
from jaxencoder.data import kinds
from jaxencoder.model.encoder import SCANNED_LAYERS
from jaxencoder.io.paths import as_path
from jaxencoder.io.run_dir import RunDir
from jaxencoder.pretrained.convert import convert
from jaxencoder.pretrained.resolver import resolve
from jaxencoder.model.restore_targets import encoder_params, restore_encoder, stored_config
from jaxencoder.model.stack_layout import loop_to_scan, scan_to_loop
from jaxencoder.tokenizer import run_tokenizer
from jaxencoder.train.config import finalize, resolve_length
from jaxencoder.train.datasets import train_examples, vocab_from_tokenizer

log = logging.getLogger("jaxencoder")

PRETRAINED = "pretrained"  # data_dir/pretrained/<name>: HF checkpoints converted for init_from
CONVERTED_FROM = "converted_from.json"  # in each: the source dir and its files' sha256


def finalized(config: ml_collections.ConfigDict, workdir=None) -> ml_collections.ConfigDict:
  """A finalized copy of `config` with init_from's architecture adopted, or from scratch
  the tokenizer's vocabulary size (datasets.vocab_from_tokenizer), and num_train_epochs
  resolved into steps (with the train examples `workdir`'s run recorded, if it has any):
  what a run trains (train_and_evaluate, evaluate_run, jaxencoder-compile)."""
  config = ml_collections.ConfigDict(config.to_dict())
  adopt(config)
  vocab_from_tokenizer(config)
  resolve_length(config, lambda: train_examples(config), _recorded(workdir))
  return finalize(config)


def _recorded(workdir) -> dict | None:
  """The config saved with `workdir`'s newest step (None: no run there, or unreadable:
  the restore names a damaged step)."""
  if workdir is None or RunDir(workdir).latest_step() is None:
    return None
  try:
    return RunDir(workdir).read_config()
  except Exception:  # orbax / tensorstore raise many types for damaged files
    return None


def adopt(config: ml_collections.ConfigDict) -> list[str]:
  """With `init_from`, sets `config.model` to the architecture stored with that checkpoint
  (all fields but EncoderConfig.runtime_fields() and `model_overrides`), and `data.tokenizer` to
  the checkpoint's when unset. Returns the changes as 'field: old -> new' lines."""
  if not config.init_from:
    return []
  changes = []
  run_dir = pretrained_run_dir(config.init_from, config.data.data_dir)
  if run_dir != config.init_from:
    changes.append(f"init_from: {config.init_from} -> {run_dir}")
    config.init_from = run_dir
  source = RunDir.open(config.init_from)
  stored = stored_config(source).to_dict()
  keep = set(EncoderConfig.runtime_fields()) | set(config.model_overrides)
  for name, value in stored.items():
    current = config.model[name]
    value = list(value) if isinstance(value, tuple) else value
    current = list(current) if isinstance(current, tuple) else current
    if name not in keep and value != current:
      config.model[name] = stored[name]
      changes.append(f"model.{name}: {current} -> {value}")
  tokenizer, text = source.tokenizer_path(), kinds.kind_of(config.data.kind).text
  if tokenizer and not config.data.tokenizer and text:
    config.data.tokenizer = str(tokenizer)
    changes.append(f"data.tokenizer: '' -> {tokenizer}")
  elif not config.data.tokenizer and text:
    run_tokenizer(source, fix="set data.tokenizer")  # no default for a tokenizer-less one
  if changes:
    log.info("init_from=%s: taking the checkpoint's %s", config.init_from, "; ".join(changes))
  return changes


def restore_base(source, abstract):
  """The encoder params of `source` (a RunDir) into `abstract` (ShapeDtypeStructs with
  shardings, without LoRA adapters: those start fresh). A source trained with LoRA gives
  its kernels with its adapters merged in (W + alpha / r A B)."""
  cfg = stored_config(source)
  if not cfg.lora_rank:
    return restore_encoder(source, abstract)
  merged = lora.merge(restore_encoder(source, encoder_params(cfg)), cfg)  # its stored layout
  if cfg.scan_layers != (SCANNED_LAYERS in abstract):
    merged = scan_to_loop(merged) if cfg.scan_layers else loop_to_scan(merged)
  return jax.tree.map(lambda x, s: jax.device_put(x, s.sharding), merged, abstract)


def pretrained_run_dir(init_from: str, data_dir) -> str:
  """`init_from` as a run directory. A Hugging Face directory (config.json + weights) or
  a registered name ("minilm"), as resolver.resolve finds them, is converted into
  data_dir/pretrained/<name> on first use, and again only when the source's files change;
  a run directory is returned as is (RUN@STEP is refused: init_from takes a run's newest
  step). (Several processes on shared storage would convert concurrently: convert first.)"""
  where = resolve(init_from)
  if where.kind == "run" and where.step is not None:
    raise ValueError(f"init_from={init_from!r}: init_from starts from a run's newest step; "
                     "to start from another: jaxencoder-convert --from RUN@STEP --to DIR, "
                     "then init_from=DIR")
  if where.kind == "run":
    return init_from
  source = as_path(where.path)
  name = where.name or f"{source.name}-{hashlib.sha256(str(source).encode()).hexdigest()[:8]}"
  target = as_path(data_dir) / PRETRAINED / name
  stamp = {"source": str(source), "files": {
      f.name: _sha256(f) for f in sorted(as_path(source).iterdir()) if f.is_file()}}
  done = target / CONVERTED_FROM
  if not done.exists() or json.loads(done.read_text()) != stamp:
    log.info("init_from=%s: converting %s into %s", init_from, source, target)
    if target.exists():  # a stale conversion in init_from's own cache
      target.rmtree()
    convert(source, target)
    done.write_text(json.dumps(stamp, indent=1) + "\n")
  return str(target)


def _sha256(path) -> str:
  digest = hashlib.sha256()
  with path.open("rb") as f:
    while chunk := f.read(1 << 24):
      digest.update(chunk)
  return digest.hexdigest()
