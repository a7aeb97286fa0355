"""text_records: CSV / TSV rows, one feature per column; each task that reads them makes
its own arrays of a row (its `record_features`, jaxencoder/tasks/)."""

from __future__ import annotations

from jaxencoder.data.kinds.base import Kind


class TextRecordsKind(Kind):
  name = "text_records"
  builder = "jaxencoder.data.builders.TextRecords"
  text, label_feature, records = True, "labels", True  # labels: multilabel's

  def pipeline(self, config, tokenizer, source, *, train, batch_size, read, features=None):
    """The task's `features` of each row; eval rows numbered (`example_index`) for metrics
    that rank the whole split."""
    from jaxencoder.data import pipeline  # lazy: tasks import without grain
    return pipeline.records_pipeline(source, features, index_examples=not train,
                                     batch_size=batch_size, read=read)

  def batch_shapes(self, config, batch):
    return None


KIND = TextRecordsKind()
