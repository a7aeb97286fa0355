"""Masked language modelling: `mlm`, and BERT's sentence-pair objectives on top of it
(`mlm_nsp`, `mlm_sop`: config task "mlm" with sentence_pair "nsp" / "sop").

MLM with `max_predictions` M > 0 computes vocabulary logits only at M gathered positions
per row (the masked ones; extra masked tokens beyond M are not predicted and are counted
in `dropped`); 0 computes logits everywhere; a batch's own `mlm_positions` [B, M] take
precedence. mlm_nsp / mlm_sop: MLM + next-sentence / sentence-order prediction on the
pooled [CLS] of sentence-pair rows (data/pairs.py).

Train batches are masked at data.mask_rate, or by train step at the rates of
data.mask_rate_schedule (mlm and electra); eval batches always at data.mask_rate, so eval
losses compare across a run. max_predictions = -1 sizes for the highest of those rates.

`mlm_loss_chunk` C > 0 computes the MLM loss C predicted positions per row at a time
(tasks/base.chunked_weighted_ce): [B, C, V] logits per step, never the whole [B, M, V]
nor its gradient; the backward pass recomputes each chunk's logits (one more
vocabulary matmul per step). Its metrics equal the full path's (float32 rounding):
- loss, mlm_loss: weighted mean cross-entropy, a float32 log-softmax of each chunk;
- accuracy: weighted top-1 hits from the same pass (a tie with the label is a hit);
- dropped_predictions: masked tokens beyond M, counted before the head as before;
- pair_loss, pair_accuracy (mlm_nsp / mlm_sop): the pair head's, never chunked.
Limits:
- C counts positions per row: a step's logits are [B, C, V] (the batch axis stays
  whole, so a batch sharded over devices stays so); M not a multiple of C is padded
  with positions that count nowhere;
- params, checkpoints and the Hugging Face conversion are the same for any C;
- the models still return logits by default (`project=True`) for whatever reads them;
- ELECTRA's generator keeps full logits (it samples from them): the key is mlm's only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxencoder.data.kinds.text_corpus import mask_rate_schedule, masked_text_pipeline
from jaxencoder.model.heads import EncoderForMaskedLM, EncoderForPreTraining, vocab_logits
from jaxencoder.model.layers import take_rows
from jaxencoder.tasks.base import (INPUT_KEYS, Family, Sums, Task, apply_model,
                                   chunked_weighted_ce, loss_summary, mean_loss,
                                   pooled_vectors, weighted_ce)

SENTENCE_PAIRS = {"nsp": "mlm_nsp", "sop": "mlm_sop"}  # config.sentence_pair -> task
# The shortest row a masked task learns from: its special tokens plus one masked token
# ([CLS] x [SEP]; sentence pairs [CLS] a [SEP] b [SEP]).
MIN_SEQ_LEN = {"mlm": 3, "electra": 3, "mlm_nsp": 5, "mlm_sop": 5}


def auto_max_predictions(data) -> int:
  """Room for 1.25x the expected masked tokens of a row at the highest rate
  (`peak_mask_rate`; max_predictions = -1), at most one per position; `data`: a config's
  data section, a ConfigDict or a stored dict."""
  return min(math.ceil(1.25 * peak_mask_rate(data) * data["seq_len"]) + 1, data["seq_len"])


def peak_mask_rate(data) -> float:
  """The highest rate batches are masked at: data.mask_rate (eval, and train before the
  schedule's first point) or a rate of data.mask_rate_schedule."""
  return max([data["mask_rate"], *(rate for _, rate in mask_rate_schedule(data))])


def max_predictions(config) -> int:
  """config.max_predictions, its automatic value for -1 (a ConfigDict or stored dict)."""
  value = config.get("max_predictions", -1)
  return value if value >= 0 else auto_max_predictions(config["data"])


def check_loss_chunk(config) -> None:
  """ValueError for an mlm_loss_chunk that is not a count of positions."""
  chunk = config.get("mlm_loss_chunk", 0)
  if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
    raise ValueError(f"mlm_loss_chunk={chunk!r} must be an int >= 0: predicted positions "
                     "per row whose logits the MLM loss computes at a time (0: all at once)")


def check_masking(name: str, config) -> None:
  """ValueError, before anything is built, for a masked objective that cannot learn:
  data.mask_rate outside (0, 1) (0 masks nothing: a loss of 0 with zero gradients; 1
  masks every token), a bad data.mask_rate_schedule (`check_rate_schedule`), a
  data.seq_len without room for the specials and a masked token, or more
  max_predictions than positions (`name`: the resolved task)."""
  data, shortest = config["data"], MIN_SEQ_LEN.get(name, 3)
  if not 0 < data["mask_rate"] < 1:
    raise ValueError(f"data.mask_rate={data['mask_rate']!r} must lie in (0, 1) for task "
                     f"{name!r}: the fraction of tokens masked (BERT: 0.15)")
  check_rate_schedule(name, data.get("mask_rate_schedule") or ())
  if data["seq_len"] < shortest:
    raise ValueError(f"data.seq_len={data['seq_len']!r} is too short for task {name!r}: "
                     f"the minimum is {shortest} (special tokens + one masked token)")
  wanted = max_predictions(config)
  if wanted > data["seq_len"]:
    raise ValueError(f"max_predictions={wanted} exceeds data.seq_len={data['seq_len']}: "
                     "at most one prediction per position (-1: automatic)")


def check_rate_schedule(name: str, schedule) -> None:
  """ValueError unless `schedule` is ((step, rate), ...) with integer steps >= 0, strictly
  increasing, and every rate in (0, 1); sentence-pair tasks (masked per example,
  data/pairs.py) take none."""
  if not schedule:
    return
  where = f"data.mask_rate_schedule={schedule!r}"
  if name in SENTENCE_PAIRS.values():
    raise ValueError(f"{where}: task {name!r} masks its sentence pairs at data.mask_rate "
                     "only; set data.mask_rate_schedule=()")
  pairs = [tuple(point) if isinstance(point, (tuple, list)) else (point,) for point in schedule]
  if any(len(p) != 2 for p in pairs):
    raise ValueError(f"{where} must be a list of (step, rate) pairs, e.g. ((0, 0.3), "
                     "(80000, 0.15))")
  steps = [step for step, _ in pairs]
  if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in steps) or any(
      b <= a for a, b in zip(steps, steps[1:])):
    raise ValueError(f"{where}: steps must be integers >= 0, strictly increasing")
  bad = [rate for _, rate in pairs if not (isinstance(rate, (int, float)) and 0 < rate < 1)]
  if bad:
    raise ValueError(f"{where}: rate {bad[0]!r} must lie in (0, 1) for task {name!r}")


def masked_positions(weights_BxL: jax.Array, max_predictions: int) -> jax.Array:
  """Indices [B, M] of the (first) M positions with weight > 0, padded with weight-0 ones."""
  return jax.lax.top_k(weights_BxL.astype(jnp.float32), max_predictions)[1]


def mlm_targets(batch, max_predictions: int) -> tuple[jax.Array, jax.Array, jax.Array | None]:
  """(labels, weights, positions [B, M]) of the MLM loss at the batch's `mlm_positions`,
  else at its first `max_predictions` masked positions; positions None: everywhere."""
  labels, weights = batch["mlm_labels"], batch["mlm_weights"]
  positions = batch.get("mlm_positions")
  if positions is None and max_predictions:
    positions = masked_positions(weights, max_predictions)
  if positions is None:
    return labels, weights, None
  return take_rows(labels, positions), take_rows(weights, positions), positions


def mlm_sums(head_out, labels, weights, positions, batch, chunk: int = 0) -> Sums:
  """MLM cross-entropy sums of the head's logits, or (chunk > 0) of its VocabProjection
  projected `chunk` positions per row at a time; with positions, masked tokens beyond
  M count as `dropped`."""
  if chunk:
    logits_of = functools.partial(vocab_logits, table_VxE=head_out.table_VxE,
                                  bias_V=head_out.bias_V)
    sums = chunked_weighted_ce(logits_of, head_out.hidden_BxLxE, labels, weights, chunk)
  else:
    sums = weighted_ce(head_out, labels, weights)
  if positions is not None:
    sums["dropped"] = jnp.sum(batch["mlm_weights"]) - sums["loss_weight"]
  return sums


def sentence_pair_sums(mlm: Sums, pair_logits_Bx2, pair_labels_B, weights_B) -> Sums:
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
  pair_mean = pair["pair_loss_sum"] / jnp.maximum(pair["pair_weight"], 1.0)
  return {**mlm, **pair, "mlm_loss_sum": mlm["loss_sum"],
          "loss_sum": mlm["loss_sum"] + mlm["loss_weight"] * pair_mean}


class MaskedLM(Family):
  names = ("mlm", *SENTENCE_PAIRS.values())
  options = {
      # mlm: "" | nsp | sop: + a pair head on sentence pairs (docs/tasks.md, "Sentence-pair
      # objectives"); the same as task mlm_nsp / mlm_sop
      "sentence_pair": "",
      # masked tasks: MLM logits at M gathered positions per row; -1: auto; 0: everywhere
      "max_predictions": -1,
      # mlm: the loss's logits C positions per row at a time ([B, C, V], recomputed in
      # the backward pass): memory for long rows; 0: all [B, M, V] at once
      "mlm_loss_chunk": 0,
  }
  exclusive = ("sentence_pair", "mlm_loss_chunk")
  predicts = dict.fromkeys(names, "vectors")

  def resolve(self, config) -> str:
    pair = config.get("sentence_pair", "")
    if pair and pair not in SENTENCE_PAIRS:
      raise ValueError(f"sentence_pair must be one of {('', *SENTENCE_PAIRS)}, got {pair!r}")
    if not pair:
      return config["task"]
    if config["task"] != "mlm":
      raise ValueError(f"sentence_pair={pair!r} is an option of task 'mlm'; task is "
                       f"{config['task']!r}")
    return SENTENCE_PAIRS[pair]

  def check(self, name, config) -> None:
    check_masking(name, config)
    check_loss_chunk(config)

  def finalize(self, name, config) -> None:
    if config.max_predictions < 0:
      config.max_predictions = auto_max_predictions(config.data)

  def task_options(self, name, config) -> dict[str, Any]:
    return {"max_predictions": max_predictions(config),
            "mlm_loss_chunk": config.get("mlm_loss_chunk", 0)}

  def build(self, name, cfg, *, num_classes=2, max_predictions: int = 0,
            mlm_loss_chunk: int = 0) -> Task:
    input_key, chunk = INPUT_KEYS[cfg.input_kind], mlm_loss_chunk
    if name == "mlm":
      model = EncoderForMaskedLM(cfg)
      def loss_fn(params, batch, rng, train):
        labels, weights, positions = mlm_targets(batch, max_predictions)
        mlm, _ = apply_model(model, params, batch, input_key, rng, train,
                             masked_positions=positions, project=not chunk)
        sums = mlm_sums(mlm, labels, weights, positions, batch, chunk)
        return mean_loss(sums), sums
      return Task(name, model, input_key, loss_fn, self)
    model = EncoderForPreTraining(cfg)
    def pair_loss_fn(params, batch, rng, train):
      labels, weights, positions = mlm_targets(batch, max_predictions)
      mlm, pair_logits, _ = apply_model(model, params, batch, input_key, rng, train,
                                        masked_positions=positions, project=not chunk)
      sums = sentence_pair_sums(mlm_sums(mlm, labels, weights, positions, batch, chunk),
                                pair_logits, batch["pair_labels"], batch["example_weights"])
      return mean_loss(sums), sums
    return Task(name, model, input_key, pair_loss_fn, self)

  def summarize(self, name, sums) -> dict[str, float]:
    out = loss_summary(sums)
    if "pair_weight" in sums:
      ratio = lambda a, b: float(sums[a]) / max(float(sums[b]), 1e-9)
      out["mlm_loss"] = ratio("mlm_loss_sum", "loss_weight")
      out["pair_loss"] = ratio("pair_loss_sum", "pair_weight")
      out["pair_accuracy"] = ratio("pair_correct", "pair_weight")
    return out

  def pipeline(self, name, config, source, tokenizer, *, train, batch_size, read, kind,
               features=None):
    data = config.data
    if not kind.corpus:
      return kind.pipeline(config, tokenizer, source, train=train, batch_size=batch_size,
                           read=read, features=features)
    if name == "mlm":
      return masked_text_pipeline(config, tokenizer, source, train=train, rate=data.mask_rate,
                                  batch_size=batch_size, read=read, scheduled=True)
    mode = data.packing if train else "pad"
    if mode != "pad":
      raise ValueError(f"sentence_pair={config.sentence_pair!r} needs one sentence pair per "
                       f"row: data.packing={mode!r} is not supported, use 'pad'")
    from jaxencoder.data import pairs, pipeline  # lazy: tasks import without grain
    spec = pipeline.default_mask(tokenizer, rate=data.mask_rate, whole_word=data.whole_word)
    objective = {v: k for k, v in SENTENCE_PAIRS.items()}[name]
    return pairs.pair_pipeline(source, tokenizer, objective, seq_len=data.seq_len, mask=spec,
                               batch_size=batch_size,
                               read=dataclasses.replace(read, drop_remainder=train))

  def stores_token_ids(self, name, config) -> bool:
    return name == "mlm" and super().stores_token_ids(name, config)

  def batch_shapes(self, name, config, batch, *, train, group, kind):
    if name == "mlm" or not kind.corpus:
      return None
    return {**kind.batch_shapes(config, batch), "pair_labels": ((batch,), np.int32),
            "example_weights": ((batch,), np.float32)}

  def predict(self, name, predictor, batch, args, lines):
    return pooled_vectors(predictor, args)


FAMILY = MaskedLM()
