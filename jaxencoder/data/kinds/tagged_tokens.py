"""tagged_tokens: sentences of words with a tag each (word/TAG lines, .conllu)."""

from __future__ import annotations

import numpy as np

from jaxencoder.data.kinds.base import Kind, text_shapes


class TaggedTokensKind(Kind):
  name = "tagged_tokens"
  builder = "jaxencoder.data.builders.TaggedTokens"
  text, label_feature = True, "tags"

  def pipeline(self, config, tokenizer, source, *, train, batch_size, read, features=None):
    from jaxencoder.data import pipeline  # lazy: tasks import without grain
    return pipeline.tagging_pipeline(source, tokenizer, seq_len=config.data.seq_len,
                                     batch_size=batch_size, read=read)

  def batch_shapes(self, config, batch):
    L = config.data.seq_len
    return {**text_shapes((batch, L), config), "labels": ((batch, L), np.int32),
            "label_weights": ((batch, L), np.float32)}


KIND = TaggedTokensKind()
