"""What may change when a run resumes: `config_changes` sorts the differences between a
run's saved config and the current one into allowed and structural ones, and
`check_config_unchanged` warns of the first and refuses the second."""

from __future__ import annotations

import logging

import ml_collections

from jaxencoder.config import EncoderConfig
from jaxencoder.train.config import base_config

log = logging.getLogger("jaxencoder")


# Keys that may change when a run resumes (with a warning): how long and how fast it
# trains, how often it logs and saves, how it runs (rng_impl: only the dropout streams
# change). Any other change (the model, the optimizer's structure, the task, the data)
# makes the saved state meaningless or unloadable, and is an error unless
# `allow_config_change` is set.
RESUMABLE_CHANGES = (
    "num_train_steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints",
    "keep_every_steps",
    "best_metric", "eval_batch_size", "progress_bar", "mesh_shape", "cpu_devices",
    "logical_axis_rules",
    "parallelism", "init_from", "model_overrides", "allow_config_change", "data.num_threads",
    "data.workers", "data.tokenize_once", "data.test_split",
    "optim.learning_rate", "optim.warmup_steps", "optim.total_steps", "optim.schedule",
    "optim.decay_fraction", "optim.decay_shape", "optim.end_lr_factor", "optim.weight_decay",
    "optim.grad_clip_norm",
    "model.dropout_rate", "model.attention_dropout_rate", "model.mlp_dropout_rate",
    "model.remat_policy", "model.attention_impl", "model.dtype", "model.check_ids",
    "rng_impl", "compilation_cache_dir", "lock_timeout_s",
    "mlm_loss_chunk")  # the same MLM loss, its logits computed in chunks


def config_changes(saved: dict, current: ml_collections.ConfigDict
                   ) -> tuple[list[str], list[str]]:
  """(allowed, structural) differences between a run's saved config and `current`,
  as 'key: saved -> current' lines."""
  from jaxencoder.io.checkpoint import to_json  # plain JSON on both sides (orbax: lazily)
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


class ConfigChangedError(ValueError):
  """Resuming with a model / optimizer / data config other than the run's saved one."""


def check_config_unchanged(run_dir, config, saved: dict | None = None) -> None:
  """Compares a saved config (default: that of the newest step of `run_dir` whose config
  reads) to `config`: allowed changes (schedule, length, logging) warn; structural ones
  raise naming each field."""
  if saved is None:
    for step in reversed(run_dir.steps()):  # the newest step whose config reads
      try:
        saved = run_dir.read_config(step)
        break
      except Exception:  # a damaged step: the restore reports it
        continue
  if not saved:
    return
  allowed, structural = config_changes(saved, config)
  if allowed:
    log.warning("resuming with changed settings: %s", "; ".join(allowed))
  if structural and not config.allow_config_change:
    raise ConfigChangedError(
        f"{run_dir.path} was trained with another config: " + "; ".join(structural) +
        ". Use a new --workdir, or --config.allow_config_change=true to resume anyway")
  if structural:
    log.warning("resuming despite config changes (allow_config_change): %s",
                "; ".join(structural))
