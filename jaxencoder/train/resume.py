"""What may change when a run resumes: `config_changes` sorts the differences between a
run's saved config and the current one into allowed and structural ones, and
`check_config_unchanged` warns of the first and refuses the second."""

from __future__ import annotations

import logging

import ml_collections

from jaxencoder.model.config import EncoderConfig
from jaxencoder.io.checkpoint import to_json
from jaxencoder.train.config import base_config

log = logging.getLogger("jaxencoder")


# Keys that may change when a run resumes (with a warning): how long and how fast it
# trains, how often it logs and saves, how it runs (rng_impl: only the dropout streams
# change). Any other change (the model, the optimizer's structure, the task, the data)
# makes the saved state meaningless or unloadable, and is an error unless
# `allow_config_change` is set.
RESUMABLE_CHANGES = (
    "num_train_steps", "num_train_epochs", "train_examples", "early_stopping_patience",
    "load_best_at_end", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints",
    "keep_every_steps",
    "best_metric", "eval_batch_size", "progress_bar", "mesh_shape", "cpu_devices",
    "logical_axis_rules",
    "parallelism", "init_from", "model_overrides", "allow_config_change", "data.num_threads",
    "data.workers", "data.tokenize_once", "data.test_split", "data.allow_changed_data",
    "optim.learning_rate", "optim.warmup_steps", "optim.total_steps", "optim.schedule",
    "optim.decay_fraction", "optim.decay_shape", "optim.end_lr_factor", "optim.weight_decay",
    "optim.grad_clip_norm",
    "model.dropout_rate", "model.attention_dropout_rate", "model.mlp_dropout_rate",
    "model.remat_policy", "model.attention_impl", "model.dtype", "model.check_ids",
    "rng_impl", "compilation_cache_dir", "lock_timeout_s",
    "eval_retrieval", "eval_sts",  # what each eval also measures; the state is the same
    "mlm_loss_chunk")  # the same MLM loss, its logits computed in chunks


def config_changes(saved: dict, current: ml_collections.ConfigDict
                   ) -> tuple[list[str], list[str]]:
  """(allowed, structural) differences between a run's saved config and `current`,
  as 'key: saved -> current' lines."""
  saved = dict(saved)
  try:  # settings added to EncoderConfig since the run was saved take their defaults
    saved["model"] = EncoderConfig.from_dict(saved.get("model") or {}).to_dict()
  except (TypeError, ValueError):
    pass  # an unreadable model config shows up as changes below
  old, new = _flatten(to_json(saved)), _flatten(to_json(current))
  for key, value in _flatten(to_json(base_config())).items():
    old.setdefault(key, value)  # settings added since: their defaults (a no-op then)
  resumable = RESUMABLE_CHANGES + (SPLIT_STEP if _same_rows_per_step(old, new) else ())
  allowed, structural = [], []
  for key in sorted(old.keys() | new.keys()):
    if old.get(key, "<unset>") != new.get(key, "<unset>"):
      line = f"{key}: {old.get(key, '<unset>')!r} -> {new.get(key, '<unset>')!r}"
      (allowed if key in resumable else structural).append(line)
  return allowed, structural


# A step's rows split another way (e.g. after an out-of-memory: half the batch_size, twice
# the micro-batches): the same rows per step, so the same batches and the same updates.
SPLIT_STEP = ("batch_size", "optim.grad_accum_steps")


def _same_rows_per_step(old: dict, new: dict) -> bool:
  rows = lambda c: c.get("batch_size", 0) * c.get("optim.grad_accum_steps", 1)  # noqa: E731
  return rows(old) == rows(new)


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


def check_before_restoring(run_dir, config, found: list[int]) -> int | None:
  """Compares the configs saved with a run's steps (`found`, oldest first; JSON only: no
  array is read) to `config` before anything is restored. The newest step whose config
  reads decides: its allowed changes warn and the newest step is returned (the restore need
  not check it again). When it differs structurally but an older step's config does not (a
  newer step saved with other settings may be damaged: the restore skips it), the restored
  step decides: None. When no step's config fits, ConfigChangedError names the newest
  one's changes."""
  configs = _readable_configs(run_dir, found)
  newest = next(configs, None)
  if not newest:
    return found[-1] if found else None
  if (not config.allow_config_change and config_changes(newest, config)[1]
      and any(not config_changes(older, config)[1] for older in configs)):
    return None  # the restore falls back or not; its step's config is checked then
  check_config_unchanged(run_dir, config, newest)  # raises, naming the changes, if any
  return found[-1]


def _readable_configs(run_dir, found: list[int]):
  """The configs saved with `found`'s steps, newest first; a damaged one is skipped (the
  restore reports it)."""
  for step in reversed(found):
    try:
      yield run_dir.read_config(step)
    except Exception:  # orbax / tensorstore raise many types for damaged files
      continue


def check_config_unchanged(run_dir, config, saved: dict) -> None:
  """Compares a saved config to `config`: allowed changes (schedule, length, logging)
  warn; structural ones raise naming each field."""
  if not saved:
    return
  allowed, structural = config_changes(saved, config)
  if structural and not config.allow_config_change:
    raise ConfigChangedError(
        f"{run_dir.path} was trained with another config: " + "; ".join(structural) +
        ". Use a new --workdir, or --config.allow_config_change=true to resume anyway")
  if allowed:
    log.warning("resuming with changed settings: %s", "; ".join(allowed))
  if structural:
    log.warning("resuming despite config changes (allow_config_change): %s",
                "; ".join(structural))
