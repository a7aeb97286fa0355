"""The seq2seq task's inputs and metrics: teacher-forced decoder inputs from the batch, and
greedy decodes scored against the targets (summable, as every task's metrics).

Batch keys: data/shuffled_words.py (`decoder_input_ids`, `decoder_mask`, `target_ids`,
`target_weights`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxencoder.decoder import EncoderDecoder, greedy_decode

DECODER_KEYS = ("decoder_input_ids", "decoder_mask")  # model inputs after tasks.MODEL_KWARGS


def greedy_sums(model: EncoderDecoder, params, batch: dict[str, jax.Array],
                input_key: str) -> dict[str, jax.Array]:
  """Greedy decodes of a batch (as many steps as the targets, from each row's first decoder
  input) against `target_ids`: correct tokens, rows right up to and including their end,
  rows with targets."""
  target_BxT = batch["target_ids"]
  real_BxT = batch["target_weights"] > 0
  tokens_BxT = greedy_decode(model, params, batch[input_key], batch.get("attention_mask"),
                             target_BxT.shape[1], batch["decoder_input_ids"][:, 0],
                             token_type_ids=batch.get("token_type_ids"))
  hits_BxT = (tokens_BxT == target_BxT) & real_BxT
  rows_B = jnp.any(real_BxT, axis=-1)
  exact_B = jnp.all(hits_BxT | ~real_BxT, axis=-1) & rows_B
  return {"greedy_correct": jnp.sum(hits_BxT, dtype=jnp.float32),
          "greedy_exact": jnp.sum(exact_B, dtype=jnp.float32),
          "greedy_rows": jnp.sum(rows_B, dtype=jnp.float32)}


def summarize(sums: dict[str, Any]) -> dict[str, float]:
  """exact_match (rows decoded exactly) and greedy_accuracy (target tokens decoded right),
  when the sums hold greedy decodes (seq2seq eval)."""
  if "greedy_rows" not in sums:
    return {}
  return {"exact_match": float(sums["greedy_exact"]) / max(float(sums["greedy_rows"]), 1e-9),
          "greedy_accuracy": float(sums["greedy_correct"])
                             / max(float(sums["loss_weight"]), 1e-9)}
