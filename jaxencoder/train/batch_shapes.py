"""The shapes and dtypes of the batches a training config's pipelines make, from the config
alone (no data read): what `jaxencoder-compile` compiles the steps for.

B batch, L data.seq_len, T = L - 1 (decoder), M choices or texts per example, C labels,
F series features, H x W x Ch image. tests/test_batch_shapes.py checks every configs/*.py
against the batches its real pipelines make.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxencoder.data import builders
from jaxencoder.tasks import registry
from jaxencoder.tasks.base import Shapes, per_example, text_shapes


def batch_shapes(config, batch_size: int, *, train: bool, group: int | None = None) -> Shapes:
  """{key: (shape, numpy dtype)} of one global batch of the train (or eval) pipeline: the
  task's (its family's `batch_shapes`), else the data kind's.
  `group`: texts per example for grouped text_records tasks (the family's default else)."""
  name, family = registry.owner(config)
  kind = lambda: kind_shapes(config, batch_size)  # noqa: E731
  shapes = family.batch_shapes(name, config, batch_size, train=train, group=group,
                               kind_shapes=kind)
  return kind() if shapes is None else shapes


def kind_shapes(config, batch_size: int) -> Shapes:
  """What the data kind's own pipeline makes (train/datasets._kind_pipeline)."""
  data, model, B, L = config.data, config.model, batch_size, config.data.seq_len
  weights = per_example(B, example_weights=np.float32)
  if data.kind == "image_arrays":
    image = (B, *model.image_size, model.num_channels)
    return {"images": (image, np.float32), **per_example(B, labels=np.int32), **weights}
  if data.kind == "time_series":
    return {"inputs": ((B, L, model.input_features), np.float32),
            "attention_mask": ((B, L), np.int32), **per_example(B, labels=np.int32), **weights}
  if data.kind == "text_corpus":
    return {**text_shapes((B, L), config), "mlm_labels": ((B, L), np.int32),
            "mlm_weights": ((B, L), np.float32)}
  if data.kind == "text_classification":
    return {**text_shapes((B, L), config), **per_example(B, labels=np.int32), **weights}
  if data.kind == "tagged_tokens":
    return {**text_shapes((B, L), config), "labels": ((B, L), np.int32),
            "label_weights": ((B, L), np.float32)}
  if data.kind == "text_records":
    raise ValueError(f"data.kind=text_records serves the tasks "
                     f"{', '.join(registry.record_tasks())}; not task={config.task!r}")
  raise ValueError(f"data.kind={data.kind!r} is not one of {', '.join(builders.KINDS)}")


def abstract_batch(shapes: dict[str, tuple], sharding=None) -> dict[str, jax.ShapeDtypeStruct]:
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
          for k, (shape, dtype) in shapes.items()}


def zeros_batch(shapes: dict[str, tuple], rows: int = 1) -> dict[str, np.ndarray]:
  """A host batch of `rows` examples of zeros (model init needs arrays, not shapes)."""
  return {k: np.zeros((rows, *shape[1:]), dtype) for k, (shape, dtype) in shapes.items()}
