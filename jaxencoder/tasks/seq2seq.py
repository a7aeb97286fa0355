"""Sequence to sequence (task `seq2seq`): an EncoderDecoder restores a text_corpus's
sentences from their shuffled words (data/shuffled_words.py); teacher-forced
cross-entropy on `target_ids`; eval also decodes greedily (exact match, greedy token
accuracy), with summable sums as every task's metrics.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from jaxencoder.data import kinds
from jaxencoder.model.decoder import EncoderDecoder, greedy_decode
from jaxencoder.tasks.base import (INPUT_KEYS, Family, Sums, Task, apply_model, loss_summary,
                                   mean_loss, text_shapes, weighted_ce)

DECODER_KEYS = ("decoder_input_ids", "decoder_mask")  # model inputs after base.MODEL_KWARGS


def greedy_sums(model: EncoderDecoder, params, batch, input_key: str) -> Sums:
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


class Seq2Seq(Family):
  names = ("seq2seq",)
  predicts = {"seq2seq": "lines"}

  def check(self, name, config) -> None:
    if not kinds.kind_of(config.data.kind).corpus:
      raise ValueError("task='seq2seq' restores a text_corpus's sentences from their shuffled "
                       f"words; data.kind={config.data.kind!r} is not text_corpus")

  def build(self, name, cfg, *, num_classes=2) -> Task:
    model, input_key = EncoderDecoder(cfg), INPUT_KEYS[cfg.input_kind]
    def loss_fn(params, batch, rng, train):
      logits_BxTxV = apply_model(model, params, batch, input_key, rng, train,
                                 **{k: batch[k] for k in DECODER_KEYS})
      sums = weighted_ce(logits_BxTxV, batch["target_ids"], batch["target_weights"])
      if not train:
        sums.update(greedy_sums(model, params, batch, input_key))
      return mean_loss(sums), sums
    return Task(name, model, input_key, loss_fn, self, DECODER_KEYS)

  def summarize(self, name, sums) -> dict[str, float]:
    """loss, accuracy (teacher-forced); in eval exact_match (rows decoded exactly) and
    greedy_accuracy (target tokens decoded right)."""
    out = loss_summary(sums)
    if "greedy_rows" in sums:
      out["exact_match"] = float(sums["greedy_exact"]) / max(float(sums["greedy_rows"]), 1e-9)
      out["greedy_accuracy"] = (float(sums["greedy_correct"])
                                / max(float(sums["loss_weight"]), 1e-9))
    return out

  def pipeline(self, name, config, source, tokenizer, *, train, batch_size, read, kind,
               features=None):
    from jaxencoder.data import shuffled_words  # lazy: tasks import without grain
    data = config.data
    return shuffled_words.shuffled_words_pipeline(
        source, tokenizer, seq_len=data.seq_len, min_words=data.min_words,
        max_words=data.max_words, batch_size=batch_size,
        read=dataclasses.replace(read, drop_remainder=train))

  def stores_token_ids(self, name, config) -> bool:
    return False

  def batch_shapes(self, name, config, batch, *, train, group, kind):
    B, T = batch, config.data.seq_len - 1
    return {**text_shapes((B, T + 1), config, ("input_ids", "attention_mask", "token_type_ids")),
            "decoder_input_ids": ((B, T), np.int32), "decoder_mask": ((B, T), np.int32),
            "target_ids": ((B, T), np.int32), "target_weights": ((B, T), np.float32)}

  def init_inputs(self, name) -> tuple:
    ids, ones = jnp.zeros((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32)
    return (ids, ones, ids, None, None, ids, ones)  # EncoderDecoder's init needs targets

  def predict(self, name, predictor, batch, args, lines):
    tok = predictor.tokenizer
    tokens_BxT = greedy_decode(predictor.model, predictor.params, *args[:2],
                               predictor.seq_len - 1, tok.cls_id, eos_id=tok.sep_id,
                               token_type_ids=args[2])
    return [f"{tok.decode(row)}\t{line}" for row, line in zip(np.asarray(tokens_BxT), lines)]


FAMILY = Seq2Seq()
