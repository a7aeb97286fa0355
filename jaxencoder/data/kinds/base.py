"""What a data kind is: `Kind`, everything about one kind of prepared dataset (one module
each, jaxencoder/data/kinds/), and the batch shapes kinds and tasks share.

Light to import (no grain, no tfds): the CLIs list the kinds, and the tasks and the train
step import, without the input pipeline (tests/test_package_layers.py).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:  # grain loads only where a pipeline is built
  import grain

  from jaxencoder.data.pipeline import Reading

TEXT_ROWS = ("input_ids", "attention_mask", "segment_ids", "positions", "token_type_ids")
Shapes = dict[str, tuple[tuple[int, ...], type]]


class Kind:
  """Everything about one kind of data: its name, builder, `data.*` options, whether its
  examples are text and which feature names their classes, its pipeline (what most tasks
  read from it) and that pipeline's batch shapes.

  A new kind is a subclass in its own module and one line in `kinds.KINDS`
  (jaxencoder/data/kinds/__init__.py); tests/lines_kind.py is one.
  """
  name: str = ""
  # Its tfds builder class, "module.Class", imported only when a dataset is prepared
  # (builders.prepare writes DATA_DIR/tfds/<name>/NAME with it).
  builder: str = ""
  # data.* keys this kind reads, with their defaults; train/config.base_config takes them
  # from every kind (a key two kinds share has one default).
  options: dict[str, Any] = {}
  text: bool = False  # examples are text, read with data.tokenizer
  label_feature: str | None = None  # the feature whose class names give a task its classes
  # Documents of running text, unlabelled: what the masked, sentence-pair and seq2seq
  # tasks read; its rows pack (data.packing), several sources mix (data.sources) and
  # its token ids may be stored when it is prepared (data.tokenize_once).
  corpus: bool = False
  # Each task makes its own arrays of an example (Family.record_features); a task that
  # makes none cannot read it, and its label feature may be absent.
  records: bool = False
  has_length: bool = True  # its rows are data.seq_len long (images are not)

  def builder_class(self) -> type:
    module, _, name = self.builder.rpartition(".")
    return getattr(importlib.import_module(module), name)

  def pipeline(self, config, tokenizer, source, *, train: bool, batch_size: int,
               read: Reading, features: Callable[[dict], dict] | None = None
               ) -> grain.IterDataset:
    """Batches of `batch_size` rows of `source` read as `read` says. `features`: a task's
    arrays of each example (`records` kinds)."""
    raise NotImplementedError

  def batch_shapes(self, config, batch: int) -> Shapes | None:
    """{key: (shape, dtype)} of a batch of `pipeline`'s; None where each task decides
    (`records`)."""
    raise NotImplementedError

  def check_model_fits(self, config, source) -> None:
    """A DataError naming the override that fixes examples of `source` (the train split)
    that the model does not take, before any step compiles."""


def text_shapes(rows: tuple[int, ...], config, keys=TEXT_ROWS) -> Shapes:
  """Token arrays of `rows` shape; no token types for a model without their table."""
  return {k: (rows, np.int32) for k in keys if k != "token_type_ids" or config.model.type_vocab_size}


def per_example(batch: int, **dtypes) -> Shapes:
  return {k: ((batch,), dtype) for k, dtype in dtypes.items()}
