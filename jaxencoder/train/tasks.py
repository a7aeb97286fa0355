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
from jaxencoder.decoder import EncoderDecoder
from jaxencoder.electra import GENERATOR_SCALE, Electra, replace_tokens
from jaxencoder.encoder import Encoder
from jaxencoder.heads import (ContrastiveHead, EncoderForMaskedLM, EncoderForPreTraining,
                              SequenceClassificationHead, TokenClassificationHead,
                              info_nce_loss)
from jaxencoder.layers import take_rows
from jaxencoder.train import objectives, pretraining, seq2seq
from jaxencoder.train.config import resolved_task

SENTENCE_PAIR_TASKS = {"mlm_nsp": "nsp", "mlm_sop": "sop"}  # task -> data/pairs.py objective
MASKED_TASKS = ("mlm", *SENTENCE_PAIR_TASKS, "electra")  # trained on BERT-masked text
TASKS = (*MASKED_TASKS, "classify", "token_classify", "contrastive", "span", "multilabel",
         "regression", "multiple_choice", "seq2seq")
MAX_SPAN_LEN = 30  # span: the longest answer (tokens) the best-span search returns
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
  """Encoder + projection to unit vectors: [B, P], or [B, K, P] for groups of K texts
  [B, K, L] (supervised pairs: text, positive[, hard negative])."""
  cfg: EncoderConfig
  projection_dim: int = 128

  def setup(self):
    self.encoder = Encoder(self.cfg)
    self.head = ContrastiveHead(self.cfg, self.projection_dim)

  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, *, deterministic: bool = True):
    args, groups = (inputs, attention_mask, token_type_ids, segment_ids, positions), None
    if is_grouped(self.cfg, inputs):
      groups, args = inputs.shape[:2], rows_of_groups(*args)
    out = self.encoder(*args, deterministic=deterministic)
    z = self.head(out.pooled)
    return z if groups is None else z.reshape(*groups, -1)


class EncoderMultipleChoice(nn.Module):
  """Encoder + one score per (text, choice) row: texts [B, C, L] -> logits [B, C]."""
  cfg: EncoderConfig

  def setup(self):
    self.encoder = Encoder(self.cfg)
    self.head = SequenceClassificationHead(self.cfg, 1)

  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, *, deterministic: bool = True):
    rows = rows_of_groups(inputs, attention_mask, token_type_ids, segment_ids, positions)
    out = self.encoder(*rows, deterministic=deterministic)
    return self.head(out.pooled, deterministic=deterministic).reshape(inputs.shape[:2])


def is_grouped(cfg: EncoderConfig, inputs) -> bool:
  """Token ids [B, K, L]: K texts per example (choices, or a pair and its negative)."""
  return cfg.input_kind == "text" and inputs.ndim == 3


def rows_of_groups(*arrays_BxKxL) -> tuple:
  """[B, K, L] arrays as [B*K, L] rows (None stays None)."""
  return tuple(None if x is None else x.reshape(-1, x.shape[-1]) for x in arrays_BxKxL)


@dataclasses.dataclass(frozen=True)
class Task:
  """A model and its loss. `loss_fn(params, batch, rng, train)` -> (loss, metric sums)."""
  name: str
  model: nn.Module
  input_key: str
  loss_fn: Callable[..., tuple[jax.Array, dict[str, jax.Array]]]
  extra_keys: tuple[str, ...] = ()  # batch keys the model takes after MODEL_KWARGS (seq2seq)

  def example_batch(self, batch: dict[str, Any]) -> tuple:
    """The positional model inputs of a batch (for init)."""
    return model_args(batch, self.input_key) + tuple(batch[k] for k in self.extra_keys)


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


def task_from_config(config, cfg: EncoderConfig, *, num_classes: int) -> Task:
  """make_task for a training config: its task (train/config.resolved_task) and task
  options. `config`: a ConfigDict, or a run's stored config dict (options an older run
  lacks take their defaults)."""
  name = resolved_task(config)
  electra = config.get("electra") or {}
  return make_task(
      name, cfg, num_classes=num_classes, projection_dim=config["projection_dim"],
      temperature=config["temperature"],
      max_predictions=max(config["max_predictions"], 0) if name in MASKED_TASKS else 0,
      max_span_len=config.get("max_span_len", MAX_SPAN_LEN),
      generator_scale=electra.get("generator_scale", GENERATOR_SCALE),
      discriminator_weight=electra.get("discriminator_weight", pretraining.DISCRIMINATOR_WEIGHT))


def make_task(name: str, cfg: EncoderConfig, *, num_classes: int = 2,
              projection_dim: int = 128, temperature: float = 0.05,
              max_predictions: int = 0, max_span_len: int = MAX_SPAN_LEN,
              rank_capacity: int = objectives.RANK_CAPACITY,
              generator_scale: float = GENERATOR_SCALE,
              discriminator_weight: float = pretraining.DISCRIMINATOR_WEIGHT) -> Task:
  """Builds one of TASKS for an encoder config.

  MLM with `max_predictions` M > 0 computes vocabulary logits only at M gathered
  positions per row (the masked ones; extra masked tokens beyond M are not
  predicted and are counted in `dropped`); 0 computes logits everywhere; a batch's
  own `mlm_positions` [B, M] take precedence (so do the other masked tasks).
  mlm_nsp / mlm_sop: MLM + next-sentence / sentence-order prediction on the pooled
  [CLS] of sentence-pair rows (data/pairs.py). electra: a generator of
  `generator_scale` x the width proposes tokens, the discriminator (`encoder`) detects
  them; loss = generator MLM + `discriminator_weight` x discriminator BCE.
  span: start and end logits per token, best span at most `max_span_len` tokens.
  multilabel: `num_classes` sigmoid outputs. regression: one output, MSE; eval
  batches with `example_index` rank their first `rank_capacity` rows (Spearman).
  multiple_choice: texts [B, C, L], one score each. seq2seq: an EncoderDecoder,
  teacher-forced cross-entropy on `target_ids`; eval also decodes greedily (exact match,
  greedy token accuracy; train/seq2seq.py). contrastive: SimCSE on single
  texts [B, L]; supervised on groups [B, K, L] (text, positive[, hard negative])
  against the batch's positives and negatives, with recall@k and MRR.
  """
  if name not in TASKS:
    raise ValueError(f"task={name!r} is not one of {TASKS}")
  input_key = INPUT_KEYS[cfg.input_kind]
  if name == "mlm":
    model = EncoderForMaskedLM(cfg)
    def loss_fn(params, batch, rng, train):
      labels, weights, positions = mlm_targets(batch, max_predictions)
      logits, _ = _apply(model, params, batch, input_key, rng, train, masked_positions=positions)
      sums = _mlm_sums(logits, labels, weights, positions, batch)
      return _mean_loss(sums), sums
  elif name in SENTENCE_PAIR_TASKS:
    model = EncoderForPreTraining(cfg)
    def loss_fn(params, batch, rng, train):
      labels, weights, positions = mlm_targets(batch, max_predictions)
      logits, pair_logits, _ = _apply(model, params, batch, input_key, rng, train,
                                      masked_positions=positions)
      sums = pretraining.sentence_pair_sums(_mlm_sums(logits, labels, weights, positions, batch),
                                            pair_logits, batch["pair_labels"],
                                            batch["example_weights"])
      return _mean_loss(sums), sums
  elif name == "electra":
    model = Electra(cfg, generator_scale)
    def loss_fn(params, batch, rng, train):
      sums = _electra(model, params, batch, input_key, rng, train, max_predictions,
                      discriminator_weight)
      return _mean_loss(sums), sums
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
  elif name == "span":
    model = EncoderClassifier(cfg, 2, token_level=True)  # a start and an end logit per token
    def loss_fn(params, batch, rng, train):
      logits_BxLx2 = _apply(model, params, batch, input_key, rng, train)
      sums = objectives.span_sums(logits_BxLx2[..., 0], logits_BxLx2[..., 1], batch,
                                  max_span_len)
      return _mean_loss(sums), sums
  elif name == "multilabel":
    model = EncoderClassifier(cfg, num_classes)
    def loss_fn(params, batch, rng, train):
      logits_BxC = _apply(model, params, batch, input_key, rng, train)
      sums = objectives.multilabel_sums(logits_BxC, batch["labels"], batch["example_weights"])
      return _mean_loss(sums), sums
  elif name == "regression":
    model = EncoderClassifier(cfg, 1)
    def loss_fn(params, batch, rng, train):
      pred_B = _apply(model, params, batch, input_key, rng, train)[:, 0]
      target_B, w_B = batch["targets"], batch["example_weights"]
      sums = objectives.regression_sums(pred_B, target_B, w_B)
      if "example_index" in batch:  # eval: every prediction, for Spearman
        sums.update(objectives.ranked_sums(pred_B, target_B, w_B, batch["example_index"],
                                           rank_capacity))
      return _mean_loss(sums), sums
  elif name == "seq2seq":
    model = EncoderDecoder(cfg)
    def loss_fn(params, batch, rng, train):
      logits_BxTxV = _apply(model, params, batch, input_key, rng, train,
                            **{k: batch[k] for k in seq2seq.DECODER_KEYS})
      sums = _weighted_ce(logits_BxTxV, batch["target_ids"], batch["target_weights"])
      if not train:
        sums.update(seq2seq.greedy_sums(model, params, batch, input_key))
      return _mean_loss(sums), sums
    return Task(name, model, input_key, loss_fn, seq2seq.DECODER_KEYS)
  elif name == "multiple_choice":
    model = EncoderMultipleChoice(cfg)
    def loss_fn(params, batch, rng, train):
      logits_BxC = _apply(model, params, batch, input_key, rng, train)
      sums = _weighted_ce(logits_BxC, batch["labels"], batch["example_weights"])
      return _mean_loss(sums), sums
  else:
    model = EncoderContrastive(cfg, projection_dim)
    def loss_fn(params, batch, rng, train):
      if is_grouped(cfg, batch[input_key]):
        sums = _supervised_pairs(model, params, batch, input_key, rng, train, temperature)
        return _mean_loss(sums), sums
      # SimCSE: two dropout views of the same batch are positives.
      rng_a, rng_b = jax.random.split(rng)
      z_a = _apply(model, params, batch, input_key, rng_a, train)
      z_b = _apply(model, params, batch, input_key, rng_b, train)
      loss = info_nce_loss(z_a, z_b, temperature)
      hits = jnp.argmax(z_a @ z_b.T, -1) == jnp.arange(z_a.shape[0])
      n = jnp.float32(z_a.shape[0])
      return loss, {"loss_sum": loss * n, "loss_weight": n, "correct": jnp.sum(hits)}
  return Task(name, model, input_key, loss_fn)


def _mean_loss(sums: dict[str, jax.Array]) -> jax.Array:
  return sums["loss_sum"] / jnp.maximum(sums["loss_weight"], 1.0)


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


def _mlm_sums(logits, labels, weights, positions, batch) -> dict[str, jax.Array]:
  """MLM cross-entropy sums; with positions, masked tokens beyond M count as `dropped`."""
  sums = _weighted_ce(logits, labels, weights)
  if positions is not None:
    sums["dropped"] = jnp.sum(batch["mlm_weights"]) - sums["loss_weight"]
  return sums


def _electra(model, params, batch, input_key, rng, train, max_predictions,
             discriminator_weight) -> dict[str, jax.Array]:
  """ELECTRA's sums: the generator's MLM at the masked positions, a token sampled at
  each (no gradient through the draw), the discriminator on the corrupted ids."""
  gen_rng, sample_rng, disc_rng = jax.random.split(rng, 3)
  labels, weights, positions = mlm_targets(batch, max_predictions)
  logits = _apply(model, params, batch, input_key, gen_rng, train, method="generate",
                  masked_positions=positions)
  generator = _mlm_sums(logits, labels, weights, positions, batch)
  ids_BxL, replaced_BxL = replace_tokens(sample_rng, logits, batch["mlm_labels"], weights,
                                         positions)
  disc_logits = _apply(model, params, {**batch, input_key: ids_BxL}, input_key, disc_rng,
                       train, method="discriminate")
  real_BxL = batch.get("attention_mask", jnp.ones_like(ids_BxL))
  return pretraining.electra_sums(
      generator, pretraining.discriminator_sums(disc_logits, replaced_BxL, real_BxL),
      discriminator_weight)


def _supervised_pairs(model, params, batch, input_key, rng, train, temperature):
  """Text k=0 of each group against every positive (k=1) and hard negative (k=2) of the
  batch: InfoNCE and retrieval sums (objectives.retrieval_sums)."""
  z_BxKxP = _apply(model, params, batch, input_key, rng, train)
  batch_size, k, dim = z_BxKxP.shape
  w_B = batch["example_weights"]
  cands_NxP = jnp.swapaxes(z_BxKxP[:, 1:], 0, 1).reshape(-1, dim)  # positives, then negatives
  return objectives.retrieval_sums(z_BxKxP[:, 0], cands_NxP, w_B, jnp.tile(w_B, k - 1),
                                   temperature)


def summarize(sums: dict[str, Any]) -> dict[str, float]:
  """Metric sums -> loss, accuracy (not for regression), (when counted) macro F1, and the
  objectives' metrics (objectives.summarize: span F1, multi-label F1, Pearson and
  Spearman, recall@k and MRR)."""
  weight = max(float(sums["loss_weight"]), 1e-9)
  out = {"loss": float(sums["loss_sum"]) / weight, "accuracy": float(sums["correct"]) / weight}
  if "dropped" in sums:
    out["dropped_predictions"] = float(sums["dropped"])
  if "tp" in sums:
    tp, fp, fn = (jnp.asarray(sums[k]) for k in ("tp", "fp", "fn"))
    f1 = 2 * tp / jnp.maximum(2 * tp + fp + fn, 1e-9)
    present = (tp + fn + fp) > 0  # classes in the gold labels or the predictions
    out["f1_macro"] = float(jnp.sum(f1 * present) / jnp.maximum(jnp.sum(present), 1))
  out.update(objectives.summarize(sums))
  out.update(pretraining.summarize(sums))
  out.update(seq2seq.summarize(sums))
  if objectives.is_regression(sums):
    del out["accuracy"]
  return out
