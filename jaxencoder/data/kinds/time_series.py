"""time_series: series [L, F] float32 with a class each (UCR/UEA .ts files)."""

from __future__ import annotations

import numpy as np

from jaxencoder.data.kinds.base import Kind, per_example
from jaxencoder.data.readers import DataError


class TimeSeriesKind(Kind):
  name = "time_series"
  builder = "jaxencoder.data.builders.TimeSeries"
  options = {
      "random_shift": 0,  # train: shift each series by up to this many steps (images: pixels)
      "random_scale": 0.0,  # train: scale each series by a factor in [1 - s, 1 + s]
  }
  label_feature = "label"

  def pipeline(self, config, tokenizer, source, *, train, batch_size, read, features=None):
    from jaxencoder.data import pipeline  # lazy: tasks import without grain
    data = config.data
    return pipeline.series_pipeline(source, length=data.seq_len,
                                    random_shift=data.random_shift if train else 0,
                                    random_scale=data.random_scale if train else 0.0,
                                    batch_size=batch_size, read=read)

  def batch_shapes(self, config, batch):
    L = config.data.seq_len
    return {"inputs": ((batch, L, config.model.input_features), np.float32),
            "attention_mask": ((batch, L), np.int32),
            **per_example(batch, labels=np.int32, example_weights=np.float32)}

  def check_model_fits(self, config, source) -> None:
    if not len(source):
      return
    features, model = np.asarray(source[0]["series"]).shape[-1], config.model
    if features != model.input_features:
      raise DataError(f"{config.data.source}: its series have {features} channel"
                      f"{'s' * (features != 1)} per step but model.input_features="
                      f"{model.input_features}: add --config.model.input_features={features}")


KIND = TimeSeriesKind()
