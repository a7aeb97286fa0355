"""Losses and summable metrics of the span, multi-label, regression and retrieval
objectives: pure functions on arrays (the models that feed them are in tasks.py).

Each `*_sums` returns one batch's sums (`loss_sum`, `loss_weight`, `correct` and its
own); their totals over a split give exact metrics (`summarize`), whatever the batching.
Spearman needs every prediction: `ranked_sums` adds each eval example's prediction at
slot `example_index` of a fixed-size vector, so the total over batches is the whole
split's predictions in order.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

MASKED = -1e9  # logit of a position or candidate that may not be chosen
RANK_CAPACITY = 8192  # eval examples ranked for Spearman (more: the first ones only)
RECALL_AT = (1, 5)


def masked_cross_entropy(logits_BxN, labels_B, mask_BxN) -> jax.Array:
  """Softmax cross-entropy [B] over the allowed (mask > 0) entries only."""
  logits_BxN = jnp.where(mask_BxN > 0, logits_BxN.astype(jnp.float32), MASKED)
  return optax.softmax_cross_entropy_with_integer_labels(logits_BxN, labels_B)


# --- span extraction -------------------------------------------------------------------
def best_span(start_BxL, end_BxL, mask_BxL, max_len: int) -> tuple[jax.Array, jax.Array]:
  """(start [B], end [B]) maximising start + end logit over start <= end < start +
  max_len with both inside the mask: one argmax over the [L, L] band."""
  length = start_BxL.shape[-1]
  i_L = jnp.arange(length)
  band_LxL = (i_L[None, :] >= i_L[:, None]) & (i_L[None, :] < i_L[:, None] + max_len)
  ok_BxLxL = band_LxL[None] & (mask_BxL[:, :, None] > 0) & (mask_BxL[:, None, :] > 0)
  score_BxLxL = start_BxL[:, :, None].astype(jnp.float32) + end_BxL[:, None, :]
  best_B = jnp.argmax(jnp.where(ok_BxLxL, score_BxLxL, -jnp.inf).reshape(-1, length ** 2), -1)
  return best_B // length, best_B % length


def span_f1(pred_start, pred_end, start, end) -> jax.Array:
  """Token-overlap F1 of predicted and gold spans (inclusive ends), as SQuAD scores words."""
  overlap = jnp.maximum(jnp.minimum(pred_end, end) - jnp.maximum(pred_start, start) + 1, 0)
  return 2 * overlap / (pred_end - pred_start + 1 + end - start + 1)


def span_sums(start_BxL, end_BxL, batch: dict[str, jax.Array], max_len: int) -> dict:
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


# --- multi-label classification ----------------------------------------------------------
def multilabel_sums(logits_BxC, labels_BxC, weights_B) -> dict:
  """Sigmoid BCE (mean over the C labels); a label is predicted when its logit > 0.
  `correct`: every label right; `label_tp/fp/fn` [C] for micro and macro F1."""
  w_B = weights_B.astype(jnp.float32)
  logits_BxC = logits_BxC.astype(jnp.float32)
  bce_B = optax.sigmoid_binary_cross_entropy(logits_BxC, labels_BxC).mean(-1)
  pred_BxC, gold_BxC = (logits_BxC > 0).astype(jnp.float32), labels_BxC.astype(jnp.float32)
  exact_B = jnp.all(pred_BxC == gold_BxC, -1)
  count = lambda x_BxC: jnp.sum(x_BxC * w_B[:, None], 0)
  return {"loss_sum": jnp.sum(bce_B * w_B), "loss_weight": jnp.sum(w_B),
          "correct": jnp.sum(exact_B * w_B), "label_tp": count(pred_BxC * gold_BxC),
          "label_fp": count(pred_BxC * (1 - gold_BxC)),
          "label_fn": count((1 - pred_BxC) * gold_BxC)}


def f1_scores(tp, fp, fn) -> tuple[float, float]:
  """(micro, macro) F1 from per-label counts; macro averages the labels in gold or predicted."""
  tp, fp, fn = (np.asarray(x, np.float64) for x in (tp, fp, fn))
  micro = 2 * tp.sum() / max(2 * tp.sum() + fp.sum() + fn.sum(), 1e-9)
  f1 = 2 * tp / np.maximum(2 * tp + fp + fn, 1e-9)
  present = (tp + fn + fp) > 0  # labels in the gold set or the predictions
  return float(micro), float(f1[present].mean()) if present.any() else 0.0


# --- regression --------------------------------------------------------------------------
def regression_sums(pred_B, target_B, weights_B) -> dict:
  """Squared error (the loss: MSE) and the five sums Pearson's r needs. `correct` is 0:
  the training log's accuracy means nothing here."""
  w_B = weights_B.astype(jnp.float32)
  p_B, t_B = pred_B.astype(jnp.float32), target_B.astype(jnp.float32)
  total = lambda x_B: jnp.sum(x_B * w_B)
  return {"loss_sum": total((p_B - t_B) ** 2), "loss_weight": jnp.sum(w_B),
          "correct": jnp.zeros((), jnp.float32), "pred_sum": total(p_B),
          "target_sum": total(t_B), "pred_sq_sum": total(p_B ** 2),
          "target_sq_sum": total(t_B ** 2), "pred_target_sum": total(p_B * t_B)}


def is_regression(sums: dict[str, Any]) -> bool:
  """Regression sums (whose `correct` means nothing)."""
  return "pred_target_sum" in sums


def pearson_from_sums(n, sp, st, spp, stt, spt) -> float:
  """Pearson's r from count, sums, sums of squares and the cross sum (0 if a side is constant)."""
  n, sp, st, spp, stt, spt = (float(x) for x in (n, sp, st, spp, stt, spt))
  cov = spt - sp * st / max(n, 1e-9)
  var_p, var_t = spp - sp ** 2 / max(n, 1e-9), stt - st ** 2 / max(n, 1e-9)
  return cov / np.sqrt(var_p * var_t) if var_p > 0 and var_t > 0 else 0.0


def ranked_sums(pred_B, target_B, weights_B, index_B, capacity: int = RANK_CAPACITY) -> dict:
  """Each real row's prediction and target at slot `index_B` of [capacity] vectors (and a
  count there): summed over batches, the split's predictions in order."""
  keep_B = (weights_B > 0) & (index_B >= 0) & (index_B < capacity)
  slot_B = jnp.where(keep_B, index_B, 0)
  put = lambda x_B: jnp.zeros(capacity, jnp.float32).at[slot_B].add(
      jnp.where(keep_B, x_B.astype(jnp.float32), 0.0))
  return {"ranked_pred": put(pred_B), "ranked_target": put(target_B),
          "ranked_count": put(jnp.ones_like(pred_B))}


def rank_average(x_N: np.ndarray) -> np.ndarray:
  """1-based ranks, ties sharing their mean rank (as scipy.stats.rankdata)."""
  order = np.argsort(x_N, kind="stable")
  sorted_N = x_N[order]
  starts = np.flatnonzero(np.r_[True, sorted_N[1:] != sorted_N[:-1]])
  ends = np.r_[starts[1:], len(x_N)]
  ranks = np.empty(len(x_N))
  ranks[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
  return ranks


def spearman(pred_N, target_N) -> float:
  """Spearman's rho: Pearson's r of the average ranks."""
  rp = rank_average(np.asarray(pred_N, np.float64))
  rt = rank_average(np.asarray(target_N, np.float64))
  return pearson_from_sums(len(rp), rp.sum(), rt.sum(), (rp * rp).sum(), (rt * rt).sum(),
                           (rp * rt).sum())


# --- retrieval -----------------------------------------------------------------------------
def retrieval_sums(query_BxP, cands_NxP, weights_B, cand_weights_N, temperature: float,
                   ks=RECALL_AT) -> dict:
  """InfoNCE of query b against candidate b (N >= B candidates: the B positives, then
  hard negatives; candidates of weight 0 are never chosen), and the rank of the positive
  among the candidates: `correct` (rank 1), `hits_at_k`, `rr_sum` (reciprocal ranks)."""
  w_B = weights_B.astype(jnp.float32)
  sim_BxN = query_BxP.astype(jnp.float32) @ cands_NxP.astype(jnp.float32).T
  labels_B = jnp.arange(sim_BxN.shape[0])
  valid_1xN = cand_weights_N[None, :] > 0
  ce_B = masked_cross_entropy(sim_BxN / temperature, labels_B, valid_1xN)
  positive_Bx1 = jnp.take_along_axis(sim_BxN, labels_B[:, None], -1)
  rank_B = 1 + jnp.sum(valid_1xN & (sim_BxN > positive_Bx1), -1)
  sums = {"loss_sum": jnp.sum(ce_B * w_B), "loss_weight": jnp.sum(w_B),
          "correct": jnp.sum((rank_B == 1) * w_B), "rr_sum": jnp.sum(w_B / rank_B)}
  sums.update({f"hits_at_{k}": jnp.sum((rank_B <= k) * w_B) for k in ks})
  return sums


# --- summaries -----------------------------------------------------------------------------
def summarize(sums: dict[str, Any]) -> dict[str, float]:
  """The metrics of whichever of the sums above are present (tasks.summarize adds loss
  and accuracy)."""
  weight = max(float(sums["loss_weight"]), 1e-9)
  out = {}
  if "span_f1" in sums:
    out["span_f1"] = float(sums["span_f1"]) / weight
  if "label_tp" in sums:
    out["f1_micro"], out["f1_macro"] = f1_scores(sums["label_tp"], sums["label_fp"],
                                                 sums["label_fn"])
  if is_regression(sums):
    out["pearson"] = pearson_from_sums(sums["loss_weight"], *(sums[k] for k in (
        "pred_sum", "target_sum", "pred_sq_sum", "target_sq_sum", "pred_target_sum")))
  if "ranked_count" in sums:
    filled = np.asarray(sums["ranked_count"]) == 1
    out["spearman"] = spearman(np.asarray(sums["ranked_pred"])[filled],
                               np.asarray(sums["ranked_target"])[filled])
  if "rr_sum" in sums:
    out["mrr"] = float(sums["rr_sum"]) / weight
    out.update({k.replace("hits_at", "recall_at"): float(v) / weight
                for k, v in sums.items() if k.startswith("hits_at_")})
  return out
