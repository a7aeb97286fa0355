"""A model's own objective, measured under interventions (model/interventions.py): what
amnesic probing (probing/amnesic.py) and activation patching (probing/patching.py) read.

  objective = objectives.MlmObjective(cfg, params, tokenizer, dataset, sentence_ids)
  objective(None)                                  # {"loss", "accuracy"}: no intervention
  objective(Interventions.erase(k, m_DxD, b_D, N))  # the same masks, erased at layer k

`params` are the whole model's: {"encoder", "mlm_head"} (a masked-LM run or an HF
*ForMaskedLM directory) or {"encoder", "head"} (a classify / token_classify run:
`ClassifierObjective`). Held-out sentences are masked once, by a seed (`mask_rate` of each
sentence's real tokens, at least one; each replaced by [MASK]), so every condition is
scored on the same masks.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import ENCODER, Encoder
from jaxencoder.model.heads import (EncoderForMaskedLM, SequenceClassificationHead,
                                    TokenClassificationHead)
from jaxencoder.probing import features as features_lib

MLM_HEAD, CLASSIFIER_HEAD = "mlm_head", "head"
NEEDS_HEAD = ("needs a model with an MLM head (a masked-LM run, or a Hugging Face "
              "*ForMaskedLM directory) or a classifier run (task classify / token_classify)")


def head_of(params) -> str | None:
  """Which objective `params` can score: "mlm_head", "head" (a classifier), or None."""
  for key in (MLM_HEAD, CLASSIFIER_HEAD):
    if isinstance(params, dict) and key in params and ENCODER in params:
      return key
  return None


def encode(cfg: EncoderConfig, params, inputs: dict, interventions=None, **options):
  """The Encoder's output on a batch's input_ids / attention_mask / token_type_ids under
  `interventions` (None: none); `options`: output_hidden_states, output_head_outputs."""
  types_BxL = inputs["token_type_ids"] if cfg.type_vocab_size else None
  return Encoder(cfg).apply({"params": params[ENCODER]}, inputs["input_ids"],
                            attention_mask=inputs["attention_mask"], token_type_ids=types_BxL,
                            interventions=interventions, **options)


def mlm_logits(cfg: EncoderConfig, params, inputs: dict, positions_BxM, interventions=None,
               **options):
  """(logits [B, M, V] float32 at `positions_BxM`, EncoderOutput) of EncoderForMaskedLM on a
  batch under `interventions`; `options` as `encode`'s. The output's hidden_states[n + 1] is
  layer n's output, where interventions patch it."""
  types_BxL = inputs["token_type_ids"] if cfg.type_vocab_size else None
  variables = {"params": {ENCODER: params[ENCODER], MLM_HEAD: params[MLM_HEAD]}}
  logits_BxMxV, out = EncoderForMaskedLM(cfg).apply(
      variables, inputs["input_ids"], attention_mask=inputs["attention_mask"],
      token_type_ids=types_BxL, masked_positions=positions_BxM, interventions=interventions,
      **options)
  return logits_BxMxV.astype(jnp.float32), out


# --- masked LM ------------------------------------------------------------------------------
def mask_sentence(input_ids_L: np.ndarray, candidates_L: np.ndarray, rate: float,
                  rng: np.random.Generator) -> np.ndarray:
  """Positions to mask: each candidate with probability `rate`, at least one."""
  where = np.flatnonzero(candidates_L)
  chosen = where[rng.random(len(where)) < rate]
  if not len(chosen) and len(where):
    chosen = where[rng.integers(len(where)):][:1]
  return np.sort(chosen)


class MlmObjective:
  """MLM loss and accuracy of held-out sentences, masked once (`mask_rate`, `seed`), in
  fixed-shape batches; called with interventions (or None)."""

  def __init__(self, cfg: EncoderConfig, params, tokenizer, dataset: features_lib.Dataset,
               sentence_ids, *, mask_rate: float = 0.15, seed: int = 0, batch_size: int = 32,
               max_length: int = 128):
    self.cfg, self.params = cfg, params
    self.batches = _masked_batches(cfg, tokenizer, dataset, np.asarray(sentence_ids),
                                   mask_rate, seed, batch_size, max_length)
    self.tokens = int(sum(b["weights"].sum() for b in self.batches))

  def __call__(self, interventions=None) -> dict:
    sums = [jax.device_get(_mlm_sums(self.cfg, self.params, b["inputs"], b["positions"],
                                     b["labels"], b["weights"], interventions))
            for b in self.batches]
    return {"loss": float(sum(s[0] for s in sums)) / self.tokens,
            "accuracy": float(sum(s[1] for s in sums)) / self.tokens}


def _masked_batches(cfg, tokenizer, dataset, sentence_ids, rate, seed, batch_size,
                    max_length) -> list[dict]:
  """Fixed-shape batches of the chosen sentences with their masks: inputs, positions
  [B, M], labels [B, M], weights [B, M] (0: padding)."""
  max_length = min(max_length, cfg.max_positions)
  sub = features_lib.Dataset(dataset.level, [dataset.sentences[s] for s in sentence_ids],
                             [dataset.labels[s] for s in sentence_ids])
  lengths_S, _ = features_lib.measure(tokenizer, sub, max_length)
  special_V = np.zeros(max(tokenizer.vocab_size, cfg.vocab_size), bool)
  special_V[tokenizer.special_ids] = True
  out = []
  for bucket, rows in features_lib.plan_batches(lengths_S, batch_size,
                                                features_lib.length_buckets(max_length)):
    batch = features_lib.encode(tokenizer, sub, rows, max_length=max_length, pad_to=bucket)
    chosen = [mask_sentence(ids, (mask == 1) & ~special_V[ids], rate,
                            np.random.default_rng([seed, int(sentence_ids[r])]))
              for ids, mask, r in zip(batch["input_ids"], batch["attention_mask"], rows)]
    width = max(len(c) for c in chosen)
    positions, labels, weights = (np.zeros((batch_size, width), np.int32) for _ in range(3))
    ids = np.zeros((batch_size, bucket), np.int32)
    inputs = {k: np.zeros((batch_size, bucket), np.int32)
              for k in ("attention_mask", "token_type_ids")}
    for i, c in enumerate(chosen):
      ids[i], inputs["attention_mask"][i] = batch["input_ids"][i], batch["attention_mask"][i]
      inputs["token_type_ids"][i] = batch["token_type_ids"][i]
      positions[i, :len(c)], labels[i, :len(c)], weights[i, :len(c)] = c, ids[i, c], 1
      ids[i, c] = tokenizer.mask_id
    out.append({"inputs": {"input_ids": ids, **inputs}, "positions": positions,
                "labels": labels, "weights": weights.astype(np.float32)})
  return out


@functools.partial(jax.jit, static_argnums=0)
def _mlm_sums(cfg, params, inputs, positions_BxM, labels_BxM, weights_BxM, interventions):
  """(summed cross-entropy, correct predictions) at the masked positions."""
  logits_BxMxV, _ = mlm_logits(cfg, params, inputs, positions_BxM, interventions)
  nll_BxM = optax.softmax_cross_entropy_with_integer_labels(logits_BxMxV, labels_BxM)
  hit_BxM = (jnp.argmax(logits_BxMxV, -1) == labels_BxM).astype(jnp.float32)
  return jnp.sum(nll_BxM * weights_BxM), jnp.sum(hit_BxM * weights_BxM)


# --- classifiers ----------------------------------------------------------------------------
@dataclasses.dataclass
class ClassifierObjective:
  """A classifier's loss (mean cross-entropy) on held-out items of word-level data (a
  token_classify head, read at each word's first sub-word) or sentence-level data (a
  classify head on the pooled vector); `batches` as `item_batches` makes them."""
  cfg: EncoderConfig
  params: dict
  batches: list[dict]

  def __call__(self, interventions=None) -> float:
    sums = [jax.device_get(_classifier_sums(self.cfg, b["pooled"], self.params, b["inputs"],
                                            b["weights"], b["labels"], interventions))
            for b in self.batches]
    return float(sum(s[0] for s in sums)) / max(float(sum(s[1] for s in sums)), 1.0)


def item_batches(tokenizer, dataset: features_lib.Dataset, sentence_ids, labels_of,
                 *, batch_size: int = 32, max_length: int = 128) -> list[dict]:
  """Fixed-shape batches of the chosen sentences: inputs, first-sub-word (word level) or
  single-slot (sentence level) pooling weights [B, W, L] and labels [B, W] (-1: none);
  `labels_of(s)`: sentence s's item labels (class ids)."""
  sub = features_lib.Dataset(dataset.level, [dataset.sentences[s] for s in sentence_ids],
                             [dataset.labels[s] for s in sentence_ids])
  lengths_S, kept_S = features_lib.measure(tokenizer, sub, max_length)
  out = []
  for bucket, rows in features_lib.plan_batches(lengths_S, batch_size,
                                                features_lib.length_buckets(max_length)):
    batch = features_lib.encode(tokenizer, sub, rows, max_length=max_length, pad_to=bucket)
    width = bucket if dataset.level == "word" else 1
    pool = "first" if dataset.level == "word" else "cls"
    weights = features_lib.pooling_weights(batch, dataset.level, pool, width)
    labels = np.full((batch_size, width), -1, np.int32)
    for i, r in enumerate(rows):
      labels[i, :kept_S[r]] = np.asarray(labels_of(int(sentence_ids[r])))[:kept_S[r]]
    inputs = {k: _padded(batch[k], batch_size)
              for k in ("input_ids", "attention_mask", "token_type_ids")}
    out.append({"inputs": inputs, "weights": _padded(weights, batch_size), "labels": labels,
                "pooled": dataset.level != "word"})
  return out


def _padded(x_BxE: np.ndarray, rows: int) -> np.ndarray:
  """`x` with all-zero rows appended up to `rows` (fixed batch shapes; they count nowhere)."""
  return np.concatenate([x_BxE, np.zeros((rows - len(x_BxE),) + x_BxE.shape[1:], x_BxE.dtype)])


@functools.partial(jax.jit, static_argnums=(0, 1))
def _classifier_sums(cfg, pooled: bool, params, inputs, weights_BxWxL, labels_BxW,
                     interventions):
  """(summed cross-entropy, items) of the classifier head under `interventions`; `pooled`:
  a sequence head on the pooled vector, else a token head read through the weights."""
  out = encode(cfg, params, inputs, interventions)
  head = params[CLASSIFIER_HEAD]
  num_classes = head["classifier"]["kernel"].shape[-1]
  if pooled:
    logits_BxWxC = SequenceClassificationHead(cfg, num_classes).apply(
        {"params": head}, out.pooled)[:, None]
  else:
    logits_BxLxC = TokenClassificationHead(cfg, num_classes).apply(
        {"params": head}, out.last_hidden_state)
    logits_BxWxC = jnp.einsum("blc,bwl->bwc", logits_BxLxC.astype(jnp.float32), weights_BxWxL)
  valid_BxW = (labels_BxW >= 0).astype(jnp.float32)
  nll_BxW = optax.softmax_cross_entropy_with_integer_labels(
      logits_BxWxC.astype(jnp.float32), jnp.maximum(labels_BxW, 0))
  return jnp.sum(nll_BxW * valid_BxW), jnp.sum(valid_BxW)
