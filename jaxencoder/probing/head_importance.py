"""Which attention heads matter (Michel et al. 2019): importance by masking one head at a
time, the gradient estimate, and the pruning curve.

Each takes `loss_of(head_mask_NxH) -> float`, the loss of the model on fixed data with
that head mask (1 keeps a head, 0 drops its output; see Encoder's `head_mask`), so the
same code serves an MLM loss and a probe's loss. Importance by masking: loss with head
(n, h) alone dropped - loss with every head; the gradient estimate: the mean over batches
of |d loss / d mask[n, h]| at the all-ones mask (one backward pass per batch).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jaxencoder import progress as progress_lib

LossOf = Callable[[np.ndarray], float]


def masking_importance(loss_of: LossOf, num_layers: int, num_heads: int, *,
                       progress: bool = True) -> tuple[np.ndarray, float]:
  """([N, H] loss increase when each head alone is dropped, the loss with every head)."""
  ones_NxH = np.ones((num_layers, num_heads), np.float32)
  base = float(loss_of(ones_NxH))
  importance_NxH = np.zeros((num_layers, num_heads))
  with progress_lib.bar(num_layers * num_heads, "heads masked one at a time", unit="head",
                        every=num_heads, enabled=progress) as bar:
    for n in range(num_layers):
      for h in range(num_heads):
        mask_NxH = ones_NxH.copy()
        mask_NxH[n, h] = 0.0
        importance_NxH[n, h] = float(loss_of(mask_NxH)) - base
        bar.update(1)
  return importance_NxH, base


def pruning_order(importance_NxH: np.ndarray) -> list[tuple[int, int]]:
  """Heads from least to most important (ties: lower layer, then lower head first)."""
  flat = np.asarray(importance_NxH).reshape(-1)
  order = np.lexsort((np.arange(flat.size), flat))
  num_heads = importance_NxH.shape[1]
  return [(int(i // num_heads), int(i % num_heads)) for i in order]


def pruning_curve(loss_of: LossOf, importance_NxH: np.ndarray, points: int = 11, *,
                  progress: bool = True) -> list[dict]:
  """[{"pruned", "loss"}]: the loss with the `pruned` least important heads dropped, at
  `points` counts evenly spaced from none to all but one head."""
  order = pruning_order(importance_NxH)
  total = len(order)
  counts = sorted({int(round(c)) for c in np.linspace(0, total - 1, points)})
  curve = []
  with progress_lib.bar(len(counts), "pruning curve", unit="point",
                        enabled=progress) as bar:
    for count in counts:
      mask_NxH = np.ones(importance_NxH.shape, np.float32)
      for n, h in order[:count]:
        mask_NxH[n, h] = 0.0
      curve.append({"pruned": count, "loss": float(loss_of(mask_NxH))})
      bar.update(1)
  return curve


def gradient_importance(batch_grads_NxH) -> np.ndarray:
  """[N, H] mean over batches of |d loss / d mask| (each item: one batch's gradient at the
  all-ones mask), Michel et al.'s estimate."""
  grads = [np.abs(np.asarray(g, np.float64)) for g in batch_grads_NxH]
  if not grads:
    raise ValueError("the gradient estimate needs at least one batch")
  return np.mean(grads, axis=0)
