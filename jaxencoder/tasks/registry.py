"""The task registry: task name -> the Family that owns it. Everything outside
jaxencoder/tasks/ asks here; adding a task is one module and one line in TASK_FAMILIES."""

from __future__ import annotations

from typing import Any

from jaxencoder.model.config import EncoderConfig
from jaxencoder.data import kinds
from jaxencoder.tasks import (classification, contrastive, masked_lm, regression,
                              replaced_tokens, seq2seq, span)
from jaxencoder.tasks.base import Family, Task

TASK_FAMILIES: list[Family] = [
    masked_lm.FAMILY,
    replaced_tokens.FAMILY,
    classification.FAMILY,
    regression.FAMILY,
    span.FAMILY,
    contrastive.FAMILY,
    seq2seq.FAMILY,
]


def register(family: Family) -> None:
  """Adds a family (a plug-in from outside the package); its names must be new."""
  taken = sorted(set(family.names) & set(task_names()))
  if taken:
    raise ValueError(f"task names {taken} are already registered")
  TASK_FAMILIES.append(family)


def task_names() -> tuple[str, ...]:
  return tuple(name for family in TASK_FAMILIES for name in family.names)


def family_of(name: str) -> Family:
  for family in TASK_FAMILIES:
    if name in family.names:
      return family
  raise ValueError(f"task={name!r} is not one of {task_names()}")


def resolve(config) -> str:
  """The task a config builds: config.task with its family's options folded in (task mlm
  + sentence_pair sop -> mlm_sop). `config`: a ConfigDict or a run's stored config dict."""
  family = family_of(config["task"])
  for other in TASK_FAMILIES:
    for key in other.exclusive if other is not family else ():
      if _as_tuple(config.get(key, other.options[key])) != _as_tuple(other.options[key]):
        raise ValueError(f"{key}={config[key]!r} is an option of task "
                         f"{' / '.join(map(repr, other.names[:1]))}; task is {config['task']!r}")
  return family.resolve(config)


def _as_tuple(value):
  """A list option as its tuple default compares (a stored config holds lists)."""
  return tuple(value) if isinstance(value, list) else value


def owner(config) -> tuple[str, Family]:
  """(resolved task name, its family)."""
  name = resolve(config)
  return name, family_of(name)


def options() -> dict[str, Any]:
  """Every family's config options with their defaults (a key two families share must
  have one default)."""
  return kinds.merge_options(TASK_FAMILIES, "task option")


def make_task(name: str, cfg: EncoderConfig, *, num_classes: int = 2, **options) -> Task:
  """Builds task `name` for an encoder config; `options`: the family's build options
  (e.g. max_predictions for mlm, projection_dim for contrastive)."""
  return family_of(name).build(name, cfg, num_classes=num_classes, **options)


def task_from_config(config, cfg: EncoderConfig, *, num_classes: int) -> Task:
  """make_task for a training config: its resolved task and that task's options.
  `config`: a ConfigDict, or a run's stored config dict (options an older run lacks
  take their defaults)."""
  name, family = owner(config)
  return family.build(name, cfg, num_classes=num_classes, **family.task_options(name, config))


def record_tasks() -> tuple[str, ...]:
  """The tasks that read data.kind text_records."""
  return tuple(name for family in TASK_FAMILIES for name in family.record_columns)
