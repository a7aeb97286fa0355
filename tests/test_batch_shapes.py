"""The batch shapes jaxencoder-compile compiles for (train/batch_shapes.py) are those of the
batches every configs/*.py's real pipelines make: keys, shapes and dtypes, train and eval."""

import ml_collections
import numpy as np
import pytest

import test_configs as tc
from jaxencoder.train import datasets as pipelines
from jaxencoder.train.config_file import load_config
from jaxencoder.train.batch_shapes import batch_shapes
from jaxencoder.train.config import apply_overrides, finalize
from jaxencoder.train.loop import peek


def _shapes(batch) -> dict:
  return {k: (tuple(v.shape), v.dtype) for k, v in batch.items()}


@pytest.mark.parametrize("name", tc.CONFIGS)
def test_batch_shapes_are_the_pipelines_batches(tmp_path, name):
  config = load_config(str(tc.REPO / "configs" / f"{name}.py"))
  apply_overrides(config, tc.TINY + tc.data_overrides(config, tmp_path))
  config = finalize(ml_collections.ConfigDict(config.to_dict()))
  made = pipelines.make_pipelines(config)
  train, eval_ = peek(iter(made.train)), next(iter(made.make_eval()))
  if made.num_classes:  # the data's class count, as train.py takes it (build_task)
    config.num_classes = made.num_classes
  ids = train.get("input_ids")
  group = ids.shape[1] if ids is not None and ids.ndim == 3 else None  # the data decides it
  def expected(batch_size, train):
    shapes = batch_shapes(config, batch_size, train=train, group=group)
    return {k: (shape, np.dtype(dtype)) for k, (shape, dtype) in shapes.items()}
  assert _shapes(train) == expected(config.batch_size, True)
  assert _shapes(eval_) == expected(config.eval_batch_size, False)
