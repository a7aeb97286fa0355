"""ELECTRA pre-training (task `electra`): a generator of `generator_scale` x the width
proposes tokens at the masked positions, the discriminator (`encoder`) detects them;
loss = generator MLM + `discriminator_weight` x discriminator BCE (the model:
jaxencoder/model/electra.py).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

from jaxencoder.model.electra import GENERATOR_SCALE, Electra, replace_tokens
from jaxencoder.tasks import masked_lm
from jaxencoder.tasks.base import (INPUT_KEYS, Family, Sums, Task, apply_model, loss_summary,
                                   mean_loss, pooled_vectors)

DISCRIMINATOR_WEIGHT = 50.0  # ELECTRA: loss = generator MLM + 50 x discriminator BCE


def discriminator_sums(logits_BxL, replaced_BxL, weights_BxL) -> Sums:
  """Sigmoid cross-entropy, weight and correct guesses of the replaced-token logits,
  and the counts behind precision and recall of "replaced", over tokens with weight > 0."""
  weights_BxL = weights_BxL.astype(jnp.float32)
  bce_BxL = optax.sigmoid_binary_cross_entropy(logits_BxL, replaced_BxL)
  guess_BxL = (logits_BxL > 0).astype(jnp.float32)
  total = lambda x_BxL: jnp.sum(x_BxL * weights_BxL)
  return {"discriminator_loss_sum": total(bce_BxL), "discriminator_weight": total(1.0),
          "discriminator_correct": total(guess_BxL == replaced_BxL),
          "replaced": total(replaced_BxL), "predicted_replaced": total(guess_BxL),
          "replaced_hits": total(guess_BxL * replaced_BxL)}


def electra_sums(generator: Sums, discriminator: Sums,
                 discriminator_weight: float = DISCRIMINATOR_WEIGHT) -> Sums:
  """ELECTRA's loss: generator MLM mean + `discriminator_weight` x discriminator BCE mean.

  `generator`: the MLM cross-entropy sums (loss_sum, loss_weight, correct), kept as
  generator_*; `discriminator`: `discriminator_sums`. loss_weight is the discriminator's
  token count and `correct` its correct guesses, so `accuracy` is the discriminator's.
  """
  tokens = discriminator["discriminator_weight"]
  loss_sum = tokens * mean_loss(generator) + (discriminator_weight
                                              * discriminator["discriminator_loss_sum"])
  renamed = {(f"generator_{k}" if k in ("loss_sum", "loss_weight", "correct") else k): v
             for k, v in generator.items()}  # e.g. `dropped` stays as it is
  return {**renamed, **discriminator, "loss_sum": loss_sum, "loss_weight": tokens,
          "correct": discriminator["discriminator_correct"]}


def electra_loss_sums(model, params, batch, input_key, rng, train, max_predictions,
                      discriminator_weight) -> Sums:
  """ELECTRA's sums: the generator's MLM at the masked positions, a token sampled at
  each (no gradient through the draw), the discriminator on the corrupted ids."""
  gen_rng, sample_rng, disc_rng = jax.random.split(rng, 3)
  labels, weights, positions = masked_lm.mlm_targets(batch, max_predictions)
  logits = apply_model(model, params, batch, input_key, gen_rng, train, method="generate",
                       masked_positions=positions)
  generator = masked_lm.mlm_sums(logits, labels, weights, positions, batch)
  ids_BxL, replaced_BxL = replace_tokens(sample_rng, logits, batch["mlm_labels"], weights,
                                         positions)
  disc_logits = apply_model(model, params, {**batch, input_key: ids_BxL}, input_key, disc_rng,
                            train, method="discriminate")
  real_BxL = batch.get("attention_mask", jnp.ones_like(ids_BxL))
  return electra_sums(generator, discriminator_sums(disc_logits, replaced_BxL, real_BxL),
                      discriminator_weight)


class ReplacedTokens(Family):
  names = ("electra",)
  options = {
      "electra": {
          "generator_scale": GENERATOR_SCALE,  # generator width, heads, FFN / the discriminator's
          "discriminator_weight": DISCRIMINATOR_WEIGHT,  # loss = generator MLM + w x disc. BCE
      },
      "max_predictions": -1,  # as masked_lm's
  }
  predicts = {"electra": "vectors"}  # the discriminator's pooled vectors

  check = masked_lm.MaskedLM.check
  finalize = masked_lm.MaskedLM.finalize

  def task_options(self, name, config) -> dict[str, Any]:
    electra = config.get("electra") or {}
    return {"max_predictions": masked_lm.max_predictions(config),
            "generator_scale": electra.get("generator_scale", GENERATOR_SCALE),
            "discriminator_weight": electra.get("discriminator_weight", DISCRIMINATOR_WEIGHT)}

  def build(self, name, cfg, *, num_classes=2, max_predictions: int = 0,
            generator_scale: float = GENERATOR_SCALE,
            discriminator_weight: float = DISCRIMINATOR_WEIGHT) -> Task:
    model, input_key = Electra(cfg, generator_scale), INPUT_KEYS[cfg.input_kind]
    def loss_fn(params, batch, rng, train):
      sums = electra_loss_sums(model, params, batch, input_key, rng, train, max_predictions,
                               discriminator_weight)
      return mean_loss(sums), sums
    return Task(name, model, input_key, loss_fn, self)

  def summarize(self, name, sums) -> dict[str, float]:
    """loss_summary (accuracy: the discriminator's) and each part's metrics."""
    ratio = lambda a, b: float(sums[a]) / max(float(sums[b]), 1e-9)
    out = loss_summary(sums)
    out["generator_loss"] = ratio("generator_loss_sum", "generator_loss_weight")
    out["generator_accuracy"] = ratio("generator_correct", "generator_loss_weight")
    out["discriminator_loss"] = ratio("discriminator_loss_sum", "discriminator_weight")
    out["replaced_fraction"] = q = ratio("replaced", "discriminator_weight")
    # The BCE of always answering q (the base rate, no context): below it, the
    # discriminator reads its inputs.
    out["discriminator_prior_loss"] = float(-sum(f * math.log(f) for f in (q, 1.0 - q) if f > 0))
    out["replaced_precision"] = ratio("replaced_hits", "predicted_replaced")
    out["replaced_recall"] = ratio("replaced_hits", "replaced")
    return out

  def pipeline(self, name, config, source, tokenizer, *, train, batch_size, read, kind,
               features=None):
    if not kind.corpus:
      return kind.pipeline(config, tokenizer, source, train=train, batch_size=batch_size,
                           read=read, features=features)
    return masked_lm.masked_text_pipeline(config, tokenizer, source, train=train,
                                          rate=config.data.mask_rate, batch_size=batch_size,
                                          read=read, scheduled=True)

  def predict(self, name, predictor, batch, args, lines):
    return pooled_vectors(predictor, args)


FAMILY = ReplacedTokens()
