"""text_classification: texts (or text pairs) with a class each, from CSV / TSV files."""

from __future__ import annotations

import numpy as np

from jaxencoder.data.kinds.base import Kind, per_example, text_shapes


class TextClassificationKind(Kind):
  name = "text_classification"
  builder = "jaxencoder.data.builders.TextClassification"
  text, label_feature = True, "label"

  def pipeline(self, config, tokenizer, source, *, train, batch_size, read, features=None):
    from jaxencoder.data import pipeline  # lazy: tasks import without grain
    return pipeline.classification_pipeline(source, tokenizer, seq_len=config.data.seq_len,
                                            batch_size=batch_size, read=read)

  def batch_shapes(self, config, batch):
    return {**text_shapes((batch, config.data.seq_len), config),
            **per_example(batch, labels=np.int32, example_weights=np.float32)}


KIND = TextClassificationKind()
