"""Losses and summable metrics of the pre-training objectives beyond plain MLM: ELECTRA's
replaced-token detection and BERT's sentence-pair classification (NSP / SOP).

Pure functions on arrays; the models (jaxencoder.electra.Electra,
jaxencoder.heads.EncoderForPreTraining) are wired to them in tasks.py. Each `*_sums`
returns one batch's sums whose `loss_sum / loss_weight` is that batch's loss, plus the
sums of each part, so that `summarize` reports every part exactly over a split.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax

DISCRIMINATOR_WEIGHT = 50.0  # ELECTRA: loss = generator MLM + 50 x discriminator BCE


def _mean(loss_sum, weight) -> jax.Array:
  return loss_sum / jnp.maximum(weight, 1.0)


def discriminator_sums(logits_BxL: jax.Array, replaced_BxL: jax.Array,
                       weights_BxL: jax.Array) -> dict[str, jax.Array]:
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


def electra_sums(generator: dict[str, jax.Array], discriminator: dict[str, jax.Array],
                 discriminator_weight: float = DISCRIMINATOR_WEIGHT) -> dict[str, jax.Array]:
  """ELECTRA's loss: generator MLM mean + `discriminator_weight` x discriminator BCE mean.

  `generator`: the MLM cross-entropy sums (loss_sum, loss_weight, correct), kept as
  generator_*; `discriminator`: `discriminator_sums`. loss_weight is the discriminator's
  token count and `correct` its correct guesses, so `accuracy` is the discriminator's.
  """
  tokens = discriminator["discriminator_weight"]
  gen_mean = _mean(generator["loss_sum"], generator["loss_weight"])
  loss_sum = tokens * gen_mean + discriminator_weight * discriminator["discriminator_loss_sum"]
  renamed = {(f"generator_{k}" if k in ("loss_sum", "loss_weight", "correct") else k): v
             for k, v in generator.items()}  # e.g. `dropped` stays as it is
  return {**renamed, **discriminator, "loss_sum": loss_sum, "loss_weight": tokens,
          "correct": discriminator["discriminator_correct"]}


def sentence_pair_sums(mlm: dict[str, jax.Array], pair_logits_Bx2: jax.Array,
                       pair_labels_B: jax.Array, weights_B: jax.Array) -> dict[str, jax.Array]:
  """BERT's loss: MLM mean + sentence-pair cross-entropy mean.

  `mlm`: the MLM cross-entropy sums; its loss_weight and `correct` stay (so `accuracy`
  is MLM's), its loss_sum is kept as mlm_loss_sum.
  """
  weights_B = weights_B.astype(jnp.float32)
  ce_B = optax.softmax_cross_entropy_with_integer_labels(
      pair_logits_Bx2.astype(jnp.float32), pair_labels_B)
  hit_B = (jnp.argmax(pair_logits_Bx2, -1) == pair_labels_B).astype(jnp.float32)
  pair = {"pair_loss_sum": jnp.sum(ce_B * weights_B), "pair_weight": jnp.sum(weights_B),
          "pair_correct": jnp.sum(hit_B * weights_B)}
  pair_mean = _mean(pair["pair_loss_sum"], pair["pair_weight"])
  return {**mlm, **pair, "mlm_loss_sum": mlm["loss_sum"],
          "loss_sum": mlm["loss_sum"] + mlm["loss_weight"] * pair_mean}


def summarize(sums: dict[str, Any]) -> dict[str, float]:
  """The metrics of whichever of the sums above are present (tasks.summarize adds loss
  and accuracy: the discriminator's for ELECTRA, MLM's for sentence pairs)."""
  ratio = lambda a, b: float(sums[a]) / max(float(sums[b]), 1e-9)
  out = {}
  if "discriminator_weight" in sums:
    out["generator_loss"] = ratio("generator_loss_sum", "generator_loss_weight")
    out["generator_accuracy"] = ratio("generator_correct", "generator_loss_weight")
    out["discriminator_loss"] = ratio("discriminator_loss_sum", "discriminator_weight")
    out["replaced_fraction"] = q = ratio("replaced", "discriminator_weight")  # 1 - q: all-original accuracy
    # The BCE of always answering q (the base rate, no context): below it, the
    # discriminator reads its inputs.
    out["discriminator_prior_loss"] = float(-sum(
        f * math.log(f) for f in (q, 1.0 - q) if f > 0))
    out["replaced_precision"] = ratio("replaced_hits", "predicted_replaced")
    out["replaced_recall"] = ratio("replaced_hits", "replaced")
  if "pair_weight" in sums:
    out["mlm_loss"] = ratio("mlm_loss_sum", "loss_weight")
    out["pair_loss"] = ratio("pair_loss_sum", "pair_weight")
    out["pair_accuracy"] = ratio("pair_correct", "pair_weight")
  return out
