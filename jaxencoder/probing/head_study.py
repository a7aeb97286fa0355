"""The head study of `jaxencoder-probe --heads`: which heads a probe of the last layer
needs (jaxencoder.probing.head_importance on a real model).

A linear probe is fit on the last layer's features of the train split (all heads on).
The loss is that probe's mean cross-entropy on the items of up to `sentences` test-split
sentences, their last-layer features recomputed with a head mask (Encoder's `head_mask`);
so a head matters when dropping it changes what the probe reads. Any encoder and any
labelled data serve (no MLM head needed); heads above the layer a property lives in are
judged by whether they keep it.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxencoder import progress as progress_lib
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import Encoder
from jaxencoder.probing import features as features_lib
from jaxencoder.probing import head_importance, probes


def run(cfg: EncoderConfig, params, tokenizer, dataset: features_lib.Dataset,
        feats: features_lib.Features, probe_cfg: probes.ProbeConfig, *, sentences: int = 128,
        batch_size: int = 32, max_length: int = 128, progress: bool = True) -> dict:
  """{"importance": [N][H], "gradient_importance": [N][H], "base_loss", "base_accuracy",
  "pruning": [{"pruned", "loss"}], "most_important": [...], "objective", "sentences"}."""
  if dataset.level not in ("word", "sentence"):
    raise ValueError("--heads needs text data (word tags or sentence labels)")
  splits = probes.split_items(feats.sentence_ids_M, seed=probe_cfg.seed)
  last_MxD = np.asarray(feats.layers[-1], np.float32)
  mean_D = last_MxD[splits["train"]].mean(0)
  std_D = np.maximum(last_MxD[splits["train"]].std(0), 1e-6)
  x_MxD = (last_MxD - mean_D) / std_D
  num_classes = len(feats.label_names)
  probe_params, _ = probes.train_probe(x_MxD[splits["train"]], feats.labels_M[splits["train"]],
                                       x_MxD[splits["dev"]], feats.labels_M[splits["dev"]],
                                       num_classes, probe_cfg)
  chosen = np.unique(feats.sentence_ids_M[splits["test"]])[:sentences]
  batches = _batches(tokenizer, dataset, feats, chosen, batch_size,
                     min(max_length, cfg.max_positions))
  scorer = _Scorer(cfg, params, probe_params, mean_D, std_D, batches)
  base_loss, base_accuracy = scorer.loss_and_accuracy(np.ones(_shape(cfg), np.float32))
  importance_NxH, _ = head_importance.masking_importance(scorer.loss, *_shape(cfg),
                                                        progress=progress)
  with progress_lib.phase("head gradients", enabled=progress):
    gradient_NxH = head_importance.gradient_importance(scorer.gradients())
  curve = head_importance.pruning_curve(scorer.loss, importance_NxH, progress=progress)
  order = head_importance.pruning_order(importance_NxH)[::-1]
  return {"objective": "cross-entropy of a linear probe on the last layer, test-split items",
          "sentences": int(len(chosen)), "items": int(sum(b["count"] for b in batches)),
          "base_loss": base_loss, "base_accuracy": base_accuracy,
          "importance": importance_NxH.tolist(), "gradient_importance": gradient_NxH.tolist(),
          "most_important": [{"layer": n + 1, "head": h,  # layer 0 = embeddings, heads from 0
                              "importance": float(importance_NxH[n, h])} for n, h in order[:5]],
          "pruning": curve}


def _shape(cfg: EncoderConfig) -> tuple[int, int]:
  return cfg.num_layers, cfg.num_heads


def _batches(tokenizer, dataset, feats, chosen_S, batch_size: int, max_length: int) -> list[dict]:
  """Model inputs, pooling weights and item labels [B, W] (-1: no item) of the chosen
  sentences, in length buckets; the labels are the study's (feats.labels_M)."""
  sub = features_lib.Dataset(dataset.level, [dataset.sentences[s] for s in chosen_S],
                             [dataset.labels[s] for s in chosen_S])
  lengths_S, kept_S = features_lib.measure(tokenizer, sub, max_length)
  items = np.flatnonzero(np.isin(feats.sentence_ids_M, chosen_S))  # sentence order
  labels_M = feats.labels_M[items]
  if len(labels_M) != kept_S.sum():
    raise ValueError(f"the head study's items ({kept_S.sum()}) differ from the features' "
                     f"({len(labels_M)}): was --max-length changed?")
  offsets_S = np.concatenate([[0], np.cumsum(kept_S)[:-1]])
  out = []
  for bucket, rows in features_lib.plan_batches(lengths_S, batch_size,
                                                features_lib.length_buckets(max_length)):
    batch = features_lib.encode(tokenizer, sub, rows, max_length=max_length, pad_to=bucket)
    width = bucket if dataset.level == "word" else 1
    pool = feats.info["pool"]
    weights_BxWxL = features_lib.pooling_weights(batch, dataset.level, pool, width)
    labels_BxW = np.full((len(rows), width), -1, np.int32)
    for i, s in enumerate(rows):
      labels_BxW[i, :kept_S[s]] = labels_M[offsets_S[s]:offsets_S[s] + kept_S[s]]
    out.append({"inputs": {k: batch[k] for k in ("input_ids", "attention_mask",
                                                 "token_type_ids")},
                "weights": weights_BxWxL, "labels": labels_BxW,
                "count": int((labels_BxW >= 0).sum())})
  return out


class _Scorer:
  """The probe's loss over the chosen batches for a head mask (and its gradient)."""

  def __init__(self, cfg, params, probe_params, mean_D, std_D, batches):
    self.cfg, self.params, self.probe = cfg, params, probe_params
    self.mean_D, self.std_D, self.batches = mean_D, std_D, batches
    self.total = sum(b["count"] for b in batches)

  def loss_and_accuracy(self, mask_NxH) -> tuple[float, float]:
    sums = [jax.device_get(_batch_sums(self.cfg, self.params, self.probe, self.mean_D,
                                       self.std_D, jnp.asarray(mask_NxH), b["inputs"],
                                       b["weights"], b["labels"]))
            for b in self.batches]
    return (float(sum(s[0] for s in sums)) / self.total,
            float(sum(s[1] for s in sums)) / self.total)

  def loss(self, mask_NxH) -> float:
    return self.loss_and_accuracy(mask_NxH)[0]

  def gradients(self) -> list[np.ndarray]:
    """Per batch: d (mean loss over the batch's items) / d mask, at all heads on."""
    ones = jnp.ones(_shape(self.cfg), jnp.float32)
    return [np.asarray(_batch_grad(self.cfg, self.params, self.probe, self.mean_D, self.std_D,
                                   ones, b["inputs"], b["weights"], b["labels"])) / b["count"]
            for b in self.batches if b["count"]]


@functools.partial(jax.jit, static_argnums=0)
def _batch_sums(cfg, params, probe_params, mean_D, std_D, mask_NxH, inputs, weights_BxWxL,
                labels_BxW):
  """(summed cross-entropy, correct items) of the probe on one batch under the mask."""
  nll_BxW, correct_BxW, valid_BxW = _item_losses(cfg, params, probe_params, mean_D, std_D,
                                                 mask_NxH, inputs, weights_BxWxL, labels_BxW)
  return jnp.sum(nll_BxW * valid_BxW), jnp.sum(correct_BxW * valid_BxW)


@functools.partial(jax.jit, static_argnums=0)
def _batch_grad(cfg, params, probe_params, mean_D, std_D, mask_NxH, inputs, weights_BxWxL,
                labels_BxW):
  def summed(mask):
    nll_BxW, _, valid_BxW = _item_losses(cfg, params, probe_params, mean_D, std_D, mask,
                                         inputs, weights_BxWxL, labels_BxW)
    return jnp.sum(nll_BxW * valid_BxW)
  return jax.grad(summed)(mask_NxH)


def _item_losses(cfg, params, probe_params, mean_D, std_D, mask_NxH, inputs, weights_BxWxL,
                 labels_BxW):
  types_BxL = inputs["token_type_ids"] if cfg.type_vocab_size else None
  out = Encoder(cfg).apply({"params": params}, inputs["input_ids"],
                           attention_mask=inputs["attention_mask"], token_type_ids=types_BxL,
                           head_mask=mask_NxH)
  pooled_BxWxD = jnp.einsum("bld,bwl->bwd", out.last_hidden_state.astype(jnp.float32),
                            weights_BxWxL)
  x_BxWxD = (pooled_BxWxD - mean_D[None, None]) / std_D[None, None]
  logits_BxWxC = probes.logits(probe_params, x_BxWxD.reshape(-1, x_BxWxD.shape[-1])
                               ).reshape(*x_BxWxD.shape[:2], -1)
  valid_BxW = (labels_BxW >= 0).astype(jnp.float32)
  targets_BxW = jnp.maximum(labels_BxW, 0)
  nll_BxW = optax.softmax_cross_entropy_with_integer_labels(logits_BxWxC, targets_BxW)
  correct_BxW = (jnp.argmax(logits_BxWxC, -1) == targets_BxW).astype(jnp.float32)
  return nll_BxW, correct_BxW, valid_BxW
