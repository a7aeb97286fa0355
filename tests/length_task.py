"""A task from outside the package, as a user would add one: each text's length.

The whole task is this module; `registry.register(FAMILY)` is its one registry line.
"""

import jax.numpy as jnp
import numpy as np

from jaxencoder.model.heads import EncoderClassifier
from jaxencoder.tasks.base import (INPUT_KEYS, Family, Task, apply_model, loss_summary,
                                   mean_loss)


class TextLength(Family):
  """Regresses the fraction of each row that is real tokens from the pooled vector."""
  names = ("text_length",)
  options = {"length_scale": 1.0}  # a new config key: the target is scale x fraction
  minimized = ("abs_error",)
  predicts = {"text_length": "lines"}

  def check(self, name, config):
    if config.length_scale <= 0:
      raise ValueError(f"length_scale must be positive, got {config.length_scale!r}")

  def task_options(self, name, config):
    return {"scale": config.get("length_scale", 1.0)}

  def build(self, name, cfg, *, num_classes=2, scale=1.0):
    model, input_key = EncoderClassifier(cfg, 1), INPUT_KEYS[cfg.input_kind]
    def loss_fn(params, batch, rng, train):
      pred_B = apply_model(model, params, batch, input_key, rng, train)[:, 0]
      mask_BxL = batch["attention_mask"].astype(jnp.float32)
      target_B = scale * mask_BxL.mean(-1)
      w_B = jnp.ones_like(target_B)
      sums = {"loss_sum": jnp.sum((pred_B - target_B) ** 2), "loss_weight": jnp.sum(w_B),
              "correct": jnp.zeros(()), "abs_sum": jnp.sum(jnp.abs(pred_B - target_B))}
      return mean_loss(sums), sums
    return Task(name, model, input_key, loss_fn, self)

  def summarize(self, name, sums):
    out = loss_summary(sums)
    del out["accuracy"]
    out["abs_error"] = float(sums["abs_sum"]) / max(float(sums["loss_weight"]), 1e-9)
    return out

  def predict(self, name, predictor, batch, args, lines):
    pred_B = np.asarray(predictor.model.apply({"params": predictor.params}, *args))[:, 0]
    return [f"{value:.4f}\t{line}" for value, line in zip(pred_B, lines)]


FAMILY = TextLength()
