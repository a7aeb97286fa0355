"""The one table of data kinds, light to import (no tfds): CLIs list the kinds from it
without loading the builders (data/builders.py maps each to its builder class)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Kind:
  """A data kind: its builder (a class in builders.py), whether its examples are text
  (tokenized), and the feature whose class names give a task its classes (None: none)."""
  builder: str
  text: bool
  label_feature: str | None


# train/datasets.py and train/batch_shapes.py branch on the same names for the pipeline
# and the shapes each makes.
KINDS = {
    "text_corpus": Kind("TextCorpus", text=True, label_feature=None),
    "text_classification": Kind("TextClassification", text=True, label_feature="label"),
    "tagged_tokens": Kind("TaggedTokens", text=True, label_feature="tags"),
    "text_records": Kind("TextRecords", text=True, label_feature="labels"),  # multilabel's
    "image_arrays": Kind("ImageArrays", text=False, label_feature="label"),
    "time_series": Kind("TimeSeries", text=False, label_feature="label"),
}
TEXT_KINDS = tuple(name for name, kind in KINDS.items() if kind.text)  # tokenized
