"""image_arrays: images [H, W(, C)] uint8 with a class each (idx(.gz) pairs, .npz)."""

from __future__ import annotations

import numpy as np

from jaxencoder.data.kinds.base import Kind, per_example
from jaxencoder.data.readers import DataError


class ImageArraysKind(Kind):
  name = "image_arrays"
  builder = "jaxencoder.data.builders.ImageArrays"
  options = {
      "random_flip": False,  # train: mirror half the images left-right
      # train: shift each image by up to this many pixels (time_series: steps)
      "random_shift": 0,
  }
  label_feature, has_length = "label", False

  def pipeline(self, config, tokenizer, source, *, train, batch_size, read, features=None):
    from jaxencoder.data import pipeline  # lazy: tasks import without grain
    data = config.data
    return pipeline.image_pipeline(source, random_flip=train and data.random_flip,
                                   random_shift=data.random_shift if train else 0,
                                   batch_size=batch_size, read=read)

  def batch_shapes(self, config, batch):
    model = config.model
    image = (batch, *model.image_size, model.num_channels)
    return {"images": (image, np.float32),
            **per_example(batch, labels=np.int32, example_weights=np.float32)}

  def check_model_fits(self, config, source) -> None:
    if not len(source):
      return
    model, image = config.model, np.asarray(source[0]["image"])
    size, channels = tuple(int(n) for n in image.shape[:2]), image.shape[2] if image.ndim == 3 else 1
    fixes = []
    if channels != model.num_channels:
      fixes.append(f"--config.model.num_channels={channels}")
    if size != tuple(model.image_size):
      fixes.append(f"--config.model.image_size='({size[0]}, {size[1]})'")
    if fixes:
      raise DataError(f"{config.data.source}: its images are {size[0]}x{size[1]} with "
                      f"{channels} channel{'s' * (channels != 1)} but the model takes "
                      f"image_size={tuple(model.image_size)}, num_channels={model.num_channels}: "
                      f"add {' '.join(fixes)}")


KIND = ImageArraysKind()
