"""What each task reads from a text_records example, and the arrays it makes of it.

  task             columns ([optional])                      arrays beyond the text ones
  span             context, answer, [question, answer_start]  start_positions, end_positions,
                                                              context_mask [L]
  multilabel       text, labels, [text_b]                     labels [C] float32 (multi-hot)
  regression       text, target, [text_b]                     targets float32
  multiple_choice  text, choice_0 .. choice_{C-1}, label      text arrays [C, L] (text, choice_c)
  contrastive      text, [text_b, [negative]]                 text arrays [K, L]: K = 2, or 3
                                                              with a hard negative; [L] for
                                                              text alone (SimCSE: dropout views)

Text arrays: input_ids, token_type_ids, attention_mask, segment_ids, positions ([L],
padded to seq_len). Every example has `example_weights` (0 for a span whose answer the
truncation to seq_len cut off). Column types (labels, target, label, answer_start) are
parsed by the builder (`builders.TextRecords`).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from jaxencoder.data import packing
from jaxencoder.data.readers import DataError, as_text

TEXT_KEYS = ("input_ids", "token_type_ids")
TEXT_ARRAYS = ("input_ids", "token_type_ids", "attention_mask", "segment_ids", "positions")
COLUMNS = {"span": ("context", "answer"), "multilabel": ("text", "labels"),
           "regression": ("text", "target"), "multiple_choice": ("text", "choice_0", "label"),
           "contrastive": ("text",)}
Example = dict[str, Any]


def _optional(ex: Example, key: str) -> str | None:
  return (as_text(ex[key]) or None) if key in ex else None


def encode(tokenizer, text: str, text_b: str | None, seq_len: int, **kw) -> dict[str, np.ndarray]:
  """One text (or pair) → the padded text arrays [seq_len] (and `offsets` when asked)."""
  enc = tokenizer.encode(text, text_b, max_length=seq_len, **kw)
  row = packing.pad_example({k: enc[k] for k in TEXT_KEYS}, seq_len, TEXT_KEYS,
                            tokenizer.pad_id)
  out = {k: row[k] for k in TEXT_ARRAYS}
  if "offsets" in enc:
    out["offsets"] = enc["offsets"]  # [n, 2], unpadded
  return out


def span(tokenizer, seq_len: int, **_) -> Callable[[Example], Example]:
  """[CLS] question [SEP] context [SEP] (or [CLS] context [SEP]); the answer's first and
  last tokens; `context_mask` marks the tokens an answer may use."""
  def fn(ex):
    context, answer = as_text(ex["context"]), as_text(ex["answer"])
    question = _optional(ex, "question")
    start = int(ex["answer_start"]) if "answer_start" in ex else context.find(answer)
    if not answer or start < 0 or context[start:start + len(answer)] != answer:
      raise DataError(f"{as_text(ex['origin'])}: answer {answer!r} is not in the context"
                      + (f" at character {start}" if "answer_start" in ex else ""))
    args = (question, context) if question else (context, None)
    enc = encode(tokenizer, *args, seq_len, offsets=True)
    offsets_nx2 = enc.pop("offsets")  # characters in its own text; (0, 0) for specials
    n, end = len(offsets_nx2), start + len(answer)
    context_L = np.zeros(seq_len, np.int32)
    context_L[:n] = (enc["token_type_ids"][:n] == (1 if question else 0)) & (offsets_nx2[:, 1] > 0)
    inside = np.flatnonzero(context_L[:n] & (offsets_nx2[:, 1] > start) & (offsets_nx2[:, 0] < end))
    whole = len(inside) > 0 and offsets_nx2[inside[-1], 1] >= end  # not cut by truncation
    first, last = (int(inside[0]), int(inside[-1])) if whole else (0, 0)
    return {**enc, "context_mask": context_L, "start_positions": np.int32(first),
            "end_positions": np.int32(last), "example_weights": np.float32(bool(whole))}
  return fn


def multilabel(tokenizer, seq_len: int, *, num_labels: int, **_) -> Callable[[Example], Example]:
  def fn(ex):
    labels_C = np.zeros(num_labels, np.float32)
    labels_C[np.asarray(ex["labels"], np.int64)] = 1.0
    enc = encode(tokenizer, as_text(ex["text"]), _optional(ex, "text_b"), seq_len)
    return {**enc, "labels": labels_C, "example_weights": np.float32(1.0)}
  return fn


def regression(tokenizer, seq_len: int, **_) -> Callable[[Example], Example]:
  def fn(ex):
    enc = encode(tokenizer, as_text(ex["text"]), _optional(ex, "text_b"), seq_len)
    return {**enc, "targets": np.float32(ex["target"]), "example_weights": np.float32(1.0)}
  return fn


def _stacked(rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {k: np.stack([r[k] for r in rows]) for k in TEXT_ARRAYS}


def multiple_choice(tokenizer, seq_len: int, **_) -> Callable[[Example], Example]:
  """One (text, choice_c) pair per choice: text arrays [C, L]; `labels` the right c."""
  def fn(ex):
    choices = sorted((k for k in ex if k.startswith("choice_")), key=lambda k: int(k[7:]))
    label = int(ex["label"])
    if not 0 <= label < len(choices):
      raise DataError(f"{as_text(ex['origin'])}: label {label} is not a choice index "
                      f"(0..{len(choices) - 1})")
    text = as_text(ex["text"])
    rows = [encode(tokenizer, text, as_text(ex[c]), seq_len) for c in choices]
    return {**_stacked(rows), "labels": np.int32(label), "example_weights": np.float32(1.0)}
  return fn


def contrastive(tokenizer, seq_len: int, **_) -> Callable[[Example], Example]:
  """text, its positive text_b and (if the column exists) a hard negative: [K, L]; a
  text alone (no text_b column): [L], its positive is itself under other dropout."""
  def fn(ex):
    if "text_b" not in ex:
      return {**encode(tokenizer, as_text(ex["text"]), None, seq_len),
              "example_weights": np.float32(1.0)}
    texts = [as_text(ex[k]) for k in ("text", "text_b", "negative") if k in ex]
    rows = [encode(tokenizer, t, None, seq_len) for t in texts]
    return {**_stacked(rows), "example_weights": np.float32(1.0)}
  return fn


FEATURES = {"span": span, "multilabel": multilabel, "regression": regression,
            "multiple_choice": multiple_choice, "contrastive": contrastive}


def features(task: str, tokenizer, seq_len: int, *,
             num_labels: int | None = None) -> Callable[[Example], Example]:
  """Example → arrays for `task`; a missing column is a DataError naming those needed."""
  if task not in FEATURES:
    raise DataError(f"data.kind=text_records serves the tasks {', '.join(FEATURES)}; "
                    f"not task={task!r}")
  make = FEATURES[task](tokenizer, seq_len, num_labels=num_labels)
  def fn(ex):
    missing = [c for c in COLUMNS[task] if c not in ex]
    if missing:
      have = ", ".join(sorted(k for k in ex if k != "origin"))
      raise DataError(f"{as_text(ex.get('origin', b'text_records'))}: task {task} needs columns "
                      f"{', '.join(COLUMNS[task])}; missing {', '.join(missing)} (has {have})")
    out = make(ex)
    if "example_index" in ex:
      out["example_index"] = np.int32(ex["example_index"])
    return out
  return fn
