"""The shapes and dtypes of the batches a training config's pipelines make, from the config
alone (no data read): what `jaxencoder-compile` compiles the steps for.

B batch, L data.seq_len, T = L - 1 (decoder), M choices or texts per example, C labels,
F series features, H x W x Ch image. tests/test_batch_shapes.py checks every configs/*.py
against the batches its real pipelines make.
"""

from __future__ import annotations

import jax
import numpy as np

from jaxencoder.train.config import resolved_task
from jaxencoder.train.tasks import SENTENCE_PAIR_TASKS

TEXT_ROWS = ("input_ids", "attention_mask", "segment_ids", "positions", "token_type_ids")
# Texts per example where the data decides it: contrastive text_records rows are a text and
# its positive (2) or also a hard negative (3); multiple choice, the choices per question.
DEFAULT_GROUP = {"contrastive": 2, "multiple_choice": 4}


def _text(rows: tuple[int, ...], model, keys=TEXT_ROWS) -> dict[str, tuple]:
  """Token arrays of `rows` shape; no token types for a model without their table."""
  return {k: (rows, np.int32) for k in keys if k != "token_type_ids" or model.type_vocab_size}


def _per_example(batch: int, **keys) -> dict[str, tuple]:
  return {k: ((batch,), dtype) for k, dtype in keys.items()}


def batch_shapes(config, batch_size: int, *, train: bool,
                 group: int | None = None) -> dict[str, tuple[tuple[int, ...], type]]:
  """{key: (shape, numpy dtype)} of one global batch of the train (or eval) pipeline.
  `group`: texts per example for grouped text_records tasks (DEFAULT_GROUP otherwise)."""
  data, model, task = config.data, config.model, resolved_task(config)
  B, L = batch_size, data.seq_len
  weights = _per_example(B, example_weights=np.float32)
  if data.kind == "image_arrays":
    image = (B, *model.image_size, model.num_channels)
    return {"images": (image, np.float32), **_per_example(B, labels=np.int32), **weights}
  if data.kind == "time_series":
    return {"inputs": ((B, L, model.input_features), np.float32),
            "attention_mask": ((B, L), np.int32), **_per_example(B, labels=np.int32), **weights}
  if task == "seq2seq":
    T = L - 1
    return {**_text((B, L), model, ("input_ids", "attention_mask", "token_type_ids")),
            "decoder_input_ids": ((B, T), np.int32), "decoder_mask": ((B, T), np.int32),
            "target_ids": ((B, T), np.int32), "target_weights": ((B, T), np.float32)}
  if task == "contrastive" and data.views == "halves":
    return {**_text((B, 2, L), model), **weights}
  if data.kind == "text_corpus":
    out = {**_text((B, L), model), "mlm_labels": ((B, L), np.int32),
           "mlm_weights": ((B, L), np.float32)}
    if task in SENTENCE_PAIR_TASKS:
      out.update(_per_example(B, pair_labels=np.int32), **weights)
    return out
  if data.kind == "text_classification":
    return {**_text((B, L), model), **_per_example(B, labels=np.int32), **weights}
  if data.kind == "tagged_tokens":
    return {**_text((B, L), model), "labels": ((B, L), np.int32),
            "label_weights": ((B, L), np.float32)}
  if data.kind != "text_records":
    raise ValueError(f"data.kind={data.kind!r}: no batch shapes known for it")
  return {**_records(config, task, B, L, group), **weights,
          **({} if train else _per_example(B, example_index=np.int32))}


def _records(config, task: str, B: int, L: int, group: int | None) -> dict[str, tuple]:
  """text_records arrays (data/records.py) for `task`, without the per-example weights."""
  model = config.model
  group = group or DEFAULT_GROUP.get(task, 1)
  if task == "span":
    return {**_text((B, L), model), "context_mask": ((B, L), np.int32),
            **_per_example(B, start_positions=np.int32, end_positions=np.int32)}
  if task == "multilabel":
    return {**_text((B, L), model), "labels": ((B, config.num_classes), np.float32)}
  if task == "regression":
    return {**_text((B, L), model), **_per_example(B, targets=np.float32)}
  if task == "multiple_choice":
    return {**_text((B, group, L), model), **_per_example(B, labels=np.int32)}
  if task == "contrastive":
    return _text((B, L) if group == 1 else (B, group, L), model)
  raise ValueError(f"data.kind=text_records serves span, multilabel, regression, "
                   f"multiple_choice and contrastive; not task={task!r}")


def abstract_batch(shapes: dict[str, tuple], sharding=None) -> dict[str, jax.ShapeDtypeStruct]:
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
          for k, (shape, dtype) in shapes.items()}


def zeros_batch(shapes: dict[str, tuple], rows: int = 1) -> dict[str, np.ndarray]:
  """A host batch of `rows` examples of zeros (model init needs arrays, not shapes)."""
  return {k: np.zeros((rows, *shape[1:]), dtype) for k, (shape, dtype) in shapes.items()}
