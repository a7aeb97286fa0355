"""Span extraction (task `span`): a start and an end logit per token; the best span is at
most `max_span_len` tokens; exact match and SQuAD-style token-overlap F1.

text_records columns: context, answer, [question, answer_start]; arrays beyond the text
ones: start_positions, end_positions, context_mask [L]. A span whose answer the
truncation to seq_len cut off has example_weights 0.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxencoder.data import records
from jaxencoder.data.readers import DataError, as_text
from jaxencoder.model.heads import EncoderClassifier
from jaxencoder.tasks.base import (INPUT_KEYS, Family, Sums, Task, apply_model, loss_summary,
                                   masked_cross_entropy, mean_loss, per_example, record_shapes,
                                   text_shapes)

MAX_SPAN_LEN = 30  # the longest answer (tokens) the best-span search returns


def best_span(start_BxL, end_BxL, mask_BxL, max_len: int):
  """(start [B], end [B]) maximising start + end logit over start <= end < start +
  max_len with both inside the mask: one argmax over the [L, L] band."""
  length = start_BxL.shape[-1]
  i_L = jnp.arange(length)
  band_LxL = (i_L[None, :] >= i_L[:, None]) & (i_L[None, :] < i_L[:, None] + max_len)
  ok_BxLxL = band_LxL[None] & (mask_BxL[:, :, None] > 0) & (mask_BxL[:, None, :] > 0)
  score_BxLxL = start_BxL[:, :, None].astype(jnp.float32) + end_BxL[:, None, :]
  best_B = jnp.argmax(jnp.where(ok_BxLxL, score_BxLxL, -jnp.inf).reshape(-1, length ** 2), -1)
  return best_B // length, best_B % length


def span_f1(pred_start, pred_end, start, end):
  """Token-overlap F1 of predicted and gold spans (inclusive ends), as SQuAD scores words."""
  overlap = jnp.maximum(jnp.minimum(pred_end, end) - jnp.maximum(pred_start, start) + 1, 0)
  return 2 * overlap / (pred_end - pred_start + 1 + end - start + 1)


def span_sums(start_BxL, end_BxL, batch, max_len: int) -> Sums:
  """Mean of the start and end cross-entropies over context tokens; `correct`: the best
  span (`best_span`) is exactly the gold one; `span_f1`: its token-overlap F1."""
  mask_BxL, w_B = batch["context_mask"], batch["example_weights"].astype(jnp.float32)
  start_B, end_B = batch["start_positions"], batch["end_positions"]
  ce_B = (masked_cross_entropy(start_BxL, start_B, mask_BxL)
          + masked_cross_entropy(end_BxL, end_B, mask_BxL)) / 2
  pred_start_B, pred_end_B = best_span(start_BxL, end_BxL, mask_BxL, max_len)
  exact_B = (pred_start_B == start_B) & (pred_end_B == end_B)
  return {"loss_sum": jnp.sum(ce_B * w_B), "loss_weight": jnp.sum(w_B),
          "correct": jnp.sum(exact_B * w_B),
          "span_f1": jnp.sum(span_f1(pred_start_B, pred_end_B, start_B, end_B) * w_B)}


def span_features(tokenizer, seq_len: int):
  """[CLS] question [SEP] context [SEP] (or [CLS] context [SEP]); the answer's first and
  last tokens; `context_mask` marks the tokens an answer may use."""
  def fn(ex):
    context, answer = as_text(ex["context"]), as_text(ex["answer"])
    question = records.optional(ex, "question")
    start = int(ex["answer_start"]) if "answer_start" in ex else context.find(answer)
    if not answer or start < 0 or context[start:start + len(answer)] != answer:
      raise DataError(f"{as_text(ex['origin'])}: answer {answer!r} is not in the context"
                      + (f" at character {start}" if "answer_start" in ex else ""))
    args = (question, context) if question else (context, None)
    enc = records.encode(tokenizer, *args, seq_len, offsets=True)
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


class Span(Family):
  names = ("span",)
  options = {"max_span_len": MAX_SPAN_LEN}  # the longest answer (tokens) the search returns
  record_columns = {"span": ("context", "answer")}

  def check(self, name, config) -> None:
    if not isinstance(config.max_span_len, int) or config.max_span_len < 1:
      raise ValueError(f"max_span_len must be a positive integer, got {config.max_span_len!r}")

  def task_options(self, name, config) -> dict[str, Any]:
    return {"max_span_len": config.get("max_span_len", MAX_SPAN_LEN)}

  def build(self, name, cfg, *, num_classes=2, max_span_len: int = MAX_SPAN_LEN) -> Task:
    model = EncoderClassifier(cfg, 2, token_level=True)  # a start and an end logit per token
    input_key = INPUT_KEYS[cfg.input_kind]
    def loss_fn(params, batch, rng, train):
      logits_BxLx2 = apply_model(model, params, batch, input_key, rng, train)
      sums = span_sums(logits_BxLx2[..., 0], logits_BxLx2[..., 1], batch, max_span_len)
      return mean_loss(sums), sums
    return Task(name, model, input_key, loss_fn, self)

  def summarize(self, name, sums) -> dict[str, float]:
    """loss, accuracy (exact match) and span_f1."""
    out = loss_summary(sums)
    out["span_f1"] = float(sums["span_f1"]) / max(float(sums["loss_weight"]), 1e-9)
    return out

  def record_features(self, name, tokenizer, seq_len, *, num_labels):
    return span_features(tokenizer, seq_len)

  def batch_shapes(self, name, config, batch, *, train, group, kind):
    L = config.data.seq_len
    arrays = {**text_shapes((batch, L), config), "context_mask": ((batch, L), np.int32),
              **per_example(batch, start_positions=np.int32, end_positions=np.int32)}
    return record_shapes(arrays, batch, train=train)


FAMILY = Span()
