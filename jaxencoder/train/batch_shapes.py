"""The shapes and dtypes of the batches a training config's pipelines make, from the config
alone (no data read): what `jaxencoder-compile` compiles the steps for.

B batch, L data.seq_len, T = L - 1 (decoder), M choices or texts per example, C labels,
F series features, H x W x Ch image. tests/test_batch_shapes.py checks every configs/*.py
against the batches its real pipelines make.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxencoder.data import kinds
from jaxencoder.data.kinds.base import Shapes
from jaxencoder.tasks import registry


def batch_shapes(config, batch_size: int, *, train: bool, group: int | None = None) -> Shapes:
  """{key: (shape, numpy dtype)} of one global batch of the train (or eval) pipeline: the
  task's (its family's `batch_shapes`), else the data kind's (`Kind.batch_shapes`).
  `group`: texts per example for grouped text_records tasks (the family's default else)."""
  name, family = registry.owner(config)
  kind = kinds.kind_of(config.data.kind)
  shapes = family.batch_shapes(name, config, batch_size, train=train, group=group, kind=kind)
  shapes = kind.batch_shapes(config, batch_size) if shapes is None else shapes
  if shapes is None:  # a records kind: only the tasks that make arrays of its rows read it
    raise ValueError(f"data.kind={kind.name} serves the tasks "
                     f"{', '.join(registry.record_tasks())}; not task={config.task!r}")
  return shapes


def abstract_batch(shapes: dict[str, tuple], sharding=None) -> dict[str, jax.ShapeDtypeStruct]:
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
          for k, (shape, dtype) in shapes.items()}


def zeros_batch(shapes: dict[str, tuple], rows: int = 1) -> dict[str, np.ndarray]:
  """A host batch of `rows` examples of zeros (model init needs arrays, not shapes)."""
  return {k: np.zeros((rows, *shape[1:]), dtype) for k, (shape, dtype) in shapes.items()}
