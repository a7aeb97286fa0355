"""A data kind from outside the package, as a user would add one: labelled lines.

Each line of a `.lines` file is `LABEL<TAB>TEXT`; a file's stem names its split
(train.lines, test.lines). The whole kind is this module: its builder, its `data.*`
option, its pipeline and its batch shapes; `kinds.register(KIND)` is its one registry line.
"""

import numpy as np
import tensorflow_datasets as tfds

from jaxencoder.data import builders, readers
from jaxencoder.data.kinds.base import Kind, per_example, text_shapes


class LabelledLines(builders.KindBuilder):
  """`LABEL<TAB>TEXT` lines -> text, label (the sorted labels seen)."""
  SUFFIXES = (".lines",)

  def _rows(self, f):
    for no, line in enumerate(readers.read_text(f, self.cfg.encoding).splitlines(), 1):
      label, _, text = line.partition("\t")
      if text.strip():
        yield {"label": label.strip(), "text": text.strip(), "origin": readers.where(f, no)}

  def _info(self):
    labels = {r["label"] for fs in self._groups().values() for f in fs for r in self._rows(f)}
    return self._make_info({"text": tfds.features.Text(),
                            "label": tfds.features.ClassLabel(names=sorted(labels))})

  def _generate_examples(self, files):
    for f in files:
      for row in self._rows(f):
        yield self._key(row["origin"]), {"text": row["text"], "label": row["label"]}


class LabelledLinesKind(Kind):
  """One text and one class per line; each example weighs data.line_weight in the loss."""
  name = "labelled_lines"
  builder = "lines_kind.LabelledLines"
  options = {"line_weight": 1.0}  # a new config key: each example's weight in the loss
  text, label_feature = True, "label"

  def pipeline(self, config, tokenizer, source, *, train, batch_size, read, features=None):
    from jaxencoder.data import pipeline
    weight = np.float32(config.data.line_weight)
    batches = pipeline.classification_pipeline(source, tokenizer, seq_len=config.data.seq_len,
                                               text_b_key=None, batch_size=batch_size,
                                               read=read)
    return batches.map(lambda b: {**b, "example_weights": b["example_weights"] * weight})

  def batch_shapes(self, config, batch):
    return {**text_shapes((batch, config.data.seq_len), config),
            **per_example(batch, labels=np.int32, example_weights=np.float32)}


KIND = LabelledLinesKind()
