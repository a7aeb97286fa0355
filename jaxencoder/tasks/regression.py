"""Regression (task `regression`): one output per text (pair), MSE; Pearson's r from sums,
and Spearman's rho over the eval split: eval batches with `example_index` add each row's
prediction at slot `example_index` of a fixed-size vector (its first `rank_capacity`
rows), so the total over batches is the whole split's predictions in order.

text_records columns: text, target, [text_b]; arrays: the text ones, targets float32.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from jaxencoder.data import records
from jaxencoder.data.readers import as_text
from jaxencoder.model.heads import EncoderClassifier
from jaxencoder.rank_correlation import spearman
from jaxencoder.tasks.base import (INPUT_KEYS, Family, Sums, Task, apply_model, loss_summary,
                                   mean_loss, per_example, record_shapes, text_shapes)

RANK_CAPACITY = 8192  # eval examples ranked for Spearman (more: the first ones only)


def regression_sums(pred_B, target_B, weights_B) -> Sums:
  """Squared error (the loss: MSE) and the five sums Pearson's r needs. `correct` is 0:
  accuracy means nothing here (the summary leaves it out)."""
  w_B = weights_B.astype(jnp.float32)
  p_B, t_B = pred_B.astype(jnp.float32), target_B.astype(jnp.float32)
  total = lambda x_B: jnp.sum(x_B * w_B)
  return {"loss_sum": total((p_B - t_B) ** 2), "loss_weight": jnp.sum(w_B),
          "correct": jnp.zeros((), jnp.float32), "pred_sum": total(p_B),
          "target_sum": total(t_B), "pred_sq_sum": total(p_B ** 2),
          "target_sq_sum": total(t_B ** 2), "pred_target_sum": total(p_B * t_B)}


def pearson_from_sums(n, sp, st, spp, stt, spt) -> float:
  """Pearson's r from count, sums, sums of squares and the cross sum (0 if a side is constant)."""
  n, sp, st, spp, stt, spt = (float(x) for x in (n, sp, st, spp, stt, spt))
  cov = spt - sp * st / max(n, 1e-9)
  var_p, var_t = spp - sp ** 2 / max(n, 1e-9), stt - st ** 2 / max(n, 1e-9)
  return cov / np.sqrt(var_p * var_t) if var_p > 0 and var_t > 0 else 0.0


def ranked_sums(pred_B, target_B, weights_B, index_B, capacity: int = RANK_CAPACITY) -> Sums:
  """Each real row's prediction and target at slot `index_B` of [capacity] vectors (and a
  count there): summed over batches, the split's predictions in order."""
  keep_B = (weights_B > 0) & (index_B >= 0) & (index_B < capacity)
  slot_B = jnp.where(keep_B, index_B, 0)
  put = lambda x_B: jnp.zeros(capacity, jnp.float32).at[slot_B].add(
      jnp.where(keep_B, x_B.astype(jnp.float32), 0.0))
  return {"ranked_pred": put(pred_B), "ranked_target": put(target_B),
          "ranked_count": put(jnp.ones_like(pred_B))}


def regression_features(tokenizer, seq_len: int):
  def fn(ex):
    enc = records.encode(tokenizer, as_text(ex["text"]), records.optional(ex, "text_b"), seq_len)
    return {**enc, "targets": np.float32(ex["target"]), "example_weights": np.float32(1.0)}
  return fn


class Regression(Family):
  names = ("regression",)
  record_columns = {"regression": ("text", "target")}
  predicts = {"regression": "lines"}

  def build(self, name, cfg, *, num_classes=2, rank_capacity: int = RANK_CAPACITY) -> Task:
    model, input_key = EncoderClassifier(cfg, 1), INPUT_KEYS[cfg.input_kind]
    def loss_fn(params, batch, rng, train):
      pred_B = apply_model(model, params, batch, input_key, rng, train)[:, 0]
      target_B, w_B = batch["targets"], batch["example_weights"]
      sums = regression_sums(pred_B, target_B, w_B)
      if "example_index" in batch:  # eval: every prediction, for Spearman
        sums.update(ranked_sums(pred_B, target_B, w_B, batch["example_index"], rank_capacity))
      return mean_loss(sums), sums
    return Task(name, model, input_key, loss_fn, self)

  def summarize(self, name, sums) -> dict[str, float]:
    """loss (MSE) and Pearson's r; Spearman's rho when the sums rank the split."""
    out = loss_summary(sums)
    del out["accuracy"]
    out["pearson"] = pearson_from_sums(sums["loss_weight"], *(sums[k] for k in (
        "pred_sum", "target_sum", "pred_sq_sum", "target_sq_sum", "pred_target_sum")))
    if "ranked_count" in sums:
      filled = np.asarray(sums["ranked_count"]) == 1
      out["spearman"] = spearman(np.asarray(sums["ranked_pred"])[filled],
                                 np.asarray(sums["ranked_target"])[filled])
    return out

  def record_features(self, name, tokenizer, seq_len, *, num_labels):
    return regression_features(tokenizer, seq_len)

  def batch_shapes(self, name, config, batch, *, train, group, kind):
    if not kind.records:
      return None
    arrays = {**text_shapes((batch, config.data.seq_len), config),
              **per_example(batch, targets=np.float32)}
    return record_shapes(arrays, batch, train=train)

  def predict(self, name, predictor, batch, args, lines):
    pred_B = np.asarray(predictor.model.apply({"params": predictor.params}, *args))[:, 0]
    return [f"{value:.6g}\t{line}" for value, line in zip(pred_B, lines)]


FAMILY = Regression()
