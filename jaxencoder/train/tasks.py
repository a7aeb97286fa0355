"""Training tasks: a model (encoder + head) with its loss and summable metrics.

Metrics are sums (e.g. `loss_sum`, `loss_weight`, `correct`), so evaluation over
a whole split is exact whatever the batching; `summarize` turns them into values.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.config import EncoderConfig
from jaxencoder.encoder import Encoder
from jaxencoder.heads import (ContrastiveHead, EncoderForMaskedLM, SequenceClassificationHead,
                              TokenClassificationHead, info_nce_loss)
from jaxencoder.layers import take_rows

TASKS = ("mlm", "classify", "token_classify", "contrastive")
INPUT_KEYS = {"text": "input_ids", "image": "images", "series": "inputs"}
MODEL_KWARGS = ("attention_mask", "token_type_ids", "segment_ids", "positions")


class EncoderClassifier(nn.Module):
  """Encoder + a sequence head on the pooled vector, or a token head on every position."""
  cfg: EncoderConfig
  num_classes: int
  token_level: bool = False

  def setup(self):
    self.encoder = Encoder(self.cfg)
    head_cls = TokenClassificationHead if self.token_level else SequenceClassificationHead
    self.head = head_cls(self.cfg, self.num_classes)

  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, *, deterministic: bool = True):
    out = self.encoder(inputs, attention_mask, token_type_ids, segment_ids, positions,
                       deterministic=deterministic)
    features = out.last_hidden_state if self.token_level else out.pooled
    return self.head(features, deterministic=deterministic)


class EncoderContrastive(nn.Module):
  """Encoder + projection to unit vectors [B, P]."""
  cfg: EncoderConfig
  projection_dim: int = 128

  def setup(self):
    self.encoder = Encoder(self.cfg)
    self.head = ContrastiveHead(self.cfg, self.projection_dim)

  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, *, deterministic: bool = True):
    out = self.encoder(inputs, attention_mask, token_type_ids, segment_ids, positions,
                       deterministic=deterministic)
    return self.head(out.pooled)


@dataclasses.dataclass(frozen=True)
class Task:
  """A model and its loss. `loss_fn(params, batch, rng, train)` -> (loss, metric sums)."""
  name: str
  model: nn.Module
  input_key: str
  loss_fn: Callable[..., tuple[jax.Array, dict[str, jax.Array]]]

  def example_batch(self, batch: dict[str, Any]) -> tuple:
    """The positional model inputs of a batch (for init)."""
    return model_args(batch, self.input_key)


def model_args(batch: dict[str, Any], input_key: str) -> tuple:
  return (batch[input_key],) + tuple(batch.get(k) for k in MODEL_KWARGS)


def _apply(task_model, params, batch, input_key, rng, train, **kwargs):
  rngs = {"dropout": rng} if train else {}
  return task_model.apply({"params": params}, *model_args(batch, input_key),
                          deterministic=not train, rngs=rngs, **kwargs)


def _weighted_ce(logits, labels, weights) -> dict[str, jax.Array]:
  """Sums of cross-entropy, weight and correct top-1 guesses (a tie with the label counts).

  One max and one exp-sum over the classes serve both loss and accuracy: an argmax
  would be a third pass over [B, L, V] (4% of a full-vocabulary BERT-small step on CPU).
  """
  logits = logits.astype(jnp.float32)
  max_logit = jax.lax.stop_gradient(jnp.max(logits, -1, keepdims=True))
  log_z = jnp.log(jnp.sum(jnp.exp(logits - max_logit), -1)) + max_logit[..., 0]
  label_logit = jnp.take_along_axis(logits, labels[..., None], -1)[..., 0]
  ce = log_z - label_logit
  correct = (label_logit >= max_logit[..., 0]).astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  return {"loss_sum": jnp.sum(ce * weights), "loss_weight": jnp.sum(weights),
          "correct": jnp.sum(correct * weights)}


def _confusion(logits, labels, weights, num_classes) -> dict[str, jax.Array]:
  """Per-class true/false positives and false negatives (for macro F1)."""
  pred = jax.nn.one_hot(jnp.argmax(logits, -1), num_classes) * weights[..., None]
  gold = jax.nn.one_hot(labels, num_classes) * weights[..., None]
  axes = tuple(range(pred.ndim - 1))
  return {"tp": jnp.sum(pred * gold, axes), "fp": jnp.sum(pred * (1 - gold), axes),
          "fn": jnp.sum((1 - pred) * gold, axes)}


def masked_positions(weights_BxL: jax.Array, max_predictions: int) -> jax.Array:
  """Indices [B, M] of the (first) M positions with weight > 0, padded with weight-0 ones."""
  return jax.lax.top_k(weights_BxL.astype(jnp.float32), max_predictions)[1]


def make_task(name: str, cfg: EncoderConfig, *, num_classes: int = 2,
              projection_dim: int = 128, temperature: float = 0.05,
              max_predictions: int = 0) -> Task:
  """Builds one of TASKS for an encoder config.

  MLM with `max_predictions` M > 0 computes vocabulary logits only at M gathered
  positions per row (the masked ones; extra masked tokens beyond M are not
  predicted and are counted in `dropped`); 0 computes logits everywhere.
  """
  if name not in TASKS:
    raise ValueError(f"task={name!r} is not one of {TASKS}")
  input_key = INPUT_KEYS[cfg.input_kind]
  if name == "mlm":
    model = EncoderForMaskedLM(cfg)
    def loss_fn(params, batch, rng, train):
      labels, weights = batch["mlm_labels"], batch["mlm_weights"]
      extra = {}
      if max_predictions:
        positions = masked_positions(weights, max_predictions)
        extra = {"masked_positions": positions}
        total = jnp.sum(weights)
        labels = take_rows(labels, positions)
        weights = take_rows(weights, positions)
      logits, _ = _apply(model, params, batch, input_key, rng, train, **extra)
      sums = _weighted_ce(logits, labels, weights)
      if max_predictions:
        sums["dropped"] = total - sums["loss_weight"]
      return sums["loss_sum"] / jnp.maximum(sums["loss_weight"], 1.0), sums
  elif name in ("classify", "token_classify"):
    token_level = name == "token_classify"
    model = EncoderClassifier(cfg, num_classes, token_level=token_level)
    weight_key = "label_weights" if token_level else "example_weights"
    def loss_fn(params, batch, rng, train):
      logits = _apply(model, params, batch, input_key, rng, train)
      weights = batch.get(weight_key, jnp.ones(batch["labels"].shape, jnp.float32))
      sums = _weighted_ce(logits, batch["labels"], weights)
      sums.update(_confusion(logits, batch["labels"], weights.astype(jnp.float32), num_classes))
      return sums["loss_sum"] / jnp.maximum(sums["loss_weight"], 1.0), sums
  else:
    model = EncoderContrastive(cfg, projection_dim)
    def loss_fn(params, batch, rng, train):
      # SimCSE: two dropout views of the same batch are positives.
      rng_a, rng_b = jax.random.split(rng)
      z_a = _apply(model, params, batch, input_key, rng_a, train)
      z_b = _apply(model, params, batch, input_key, rng_b, train)
      loss = info_nce_loss(z_a, z_b, temperature)
      hits = jnp.argmax(z_a @ z_b.T, -1) == jnp.arange(z_a.shape[0])
      n = jnp.float32(z_a.shape[0])
      return loss, {"loss_sum": loss * n, "loss_weight": n, "correct": jnp.sum(hits)}
  return Task(name, model, input_key, loss_fn)


def summarize(sums: dict[str, Any]) -> dict[str, float]:
  """Metric sums -> loss, accuracy and (when counted) macro F1."""
  weight = max(float(sums["loss_weight"]), 1e-9)
  out = {"loss": float(sums["loss_sum"]) / weight, "accuracy": float(sums["correct"]) / weight}
  if "dropped" in sums:
    out["dropped_predictions"] = float(sums["dropped"])
  if "tp" in sums:
    tp, fp, fn = (jnp.asarray(sums[k]) for k in ("tp", "fp", "fn"))
    f1 = 2 * tp / jnp.maximum(2 * tp + fp + fn, 1e-9)
    present = (tp + fn) > 0
    out["f1_macro"] = float(jnp.sum(f1 * present) / jnp.maximum(jnp.sum(present), 1))
  return out
