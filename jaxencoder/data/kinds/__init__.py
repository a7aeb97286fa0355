"""The data kinds: data.kind -> the Kind that owns it (base.py). Everything else asks here;
adding a kind is one module and one line in KINDS. Light to import (no tfds, no grain):
the CLIs list the kinds from it without loading the builders.
"""

from __future__ import annotations

import copy
from typing import Any

from jaxencoder.data.kinds import (image_arrays, tagged_tokens, text_classification,
                                   text_corpus, text_records, time_series)
from jaxencoder.data.kinds.base import Kind

KINDS: list[Kind] = [
    text_corpus.KIND,
    text_classification.KIND,
    tagged_tokens.KIND,
    text_records.KIND,
    image_arrays.KIND,
    time_series.KIND,
]


def register(kind: Kind) -> None:
  """Adds a kind (a plug-in from outside the package); its name must be new."""
  if kind.name in names():
    raise ValueError(f"data kind {kind.name!r} is already registered")
  KINDS.append(kind)


def names() -> tuple[str, ...]:
  return tuple(kind.name for kind in KINDS)


def kind_of(name: str) -> Kind:
  for kind in KINDS:
    if kind.name == name:
      return kind
  raise ValueError(f"data.kind={name!r} is not one of {', '.join(names())}")


def options() -> dict[str, Any]:
  """Every kind's data.* options with their defaults (a key two kinds share must have one
  default)."""
  return merge_options(KINDS, "data option")


def merge_options(plugins, what: str) -> dict[str, Any]:
  """The `options` of plug-ins (data kinds, task families) merged, each key with its one
  default: a ValueError naming `what` and both defaults where two plug-ins disagree."""
  merged: dict[str, Any] = {}
  for plugin in plugins:
    for key, value in plugin.options.items():
      if key in merged and merged[key] != value:
        raise ValueError(f"{what} {key!r} has two defaults: {merged[key]!r}, {value!r}")
      merged[key] = copy.deepcopy(value)
  return merged
