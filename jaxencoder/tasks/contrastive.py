"""Contrastive sentence embeddings (task `contrastive`): SimCSE on single texts [B, L] (two
dropout views of a text are positives), or supervised on groups [B, K, L] (text,
positive[, hard negative]) against the batch's positives and negatives, with recall@k and
MRR. `data.views="halves"`: a text's first half's positive is its second half.
`matryoshka_dims`: the loss summed over nested prefixes of the vectors (tasks/matryoshka.py),
with metrics at each size (`mrr@128`).

text_records columns: text, [text_b, [negative | negative_1 .. negative_k]]; arrays: text
arrays [K, L] (K = 2 + the hard negatives: one `negative`, or the k of a mined set,
`jaxencoder-data mine`), or [L] for a text alone (SimCSE).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxencoder.data import kinds, records
from jaxencoder.data.readers import as_text
from jaxencoder.model.heads import EncoderContrastive, info_nce_loss, is_grouped
from jaxencoder.tasks import matryoshka
from jaxencoder.tasks.base import (INPUT_KEYS, Embedding, Family, Sums, Task, apply_model,
                                   loss_summary, masked_cross_entropy, mean_loss,
                                   pooled_vectors, record_shapes, text_shapes)

RECALL_AT = (1, 5)
VIEWS = ("dropout", "halves")
PAIR = 2  # texts per text_records example where no data says it: a text and its positive


def retrieval_sums(query_BxP, cands_NxP, weights_B, cand_weights_N, temperature: float,
                   ks=RECALL_AT) -> Sums:
  """InfoNCE of query b against candidate b (N >= B candidates: the B positives, then
  hard negatives; candidates of weight 0 are never chosen), and the rank of the positive
  among the candidates: `correct` (rank 1), `hits_at_k`, `rr_sum` (reciprocal ranks)."""
  w_B = weights_B.astype(jnp.float32)
  sim_BxN = query_BxP.astype(jnp.float32) @ cands_NxP.astype(jnp.float32).T
  labels_B = jnp.arange(sim_BxN.shape[0])
  valid_1xN = cand_weights_N[None, :] > 0
  ce_B = masked_cross_entropy(sim_BxN / temperature, labels_B, valid_1xN)
  positive_Bx1 = jnp.take_along_axis(sim_BxN, labels_B[:, None], -1)
  rank_B = 1 + jnp.sum(valid_1xN & (sim_BxN > positive_Bx1), -1)
  sums = {"loss_sum": jnp.sum(ce_B * w_B), "loss_weight": jnp.sum(w_B),
          "correct": jnp.sum((rank_B == 1) * w_B), "rr_sum": jnp.sum(w_B / rank_B)}
  sums.update({f"hits_at_{k}": jnp.sum((rank_B <= k) * w_B) for k in ks})
  return sums


def supervised_sums(model, params, batch, input_key, rng, train, temperature,
                    prefixes=matryoshka.Prefixes()) -> Sums:
  """Text k=0 of each group against every positive (k=1) and hard negative (k=2) of the
  batch: InfoNCE and retrieval sums (and each prefix's)."""
  z_BxKxP = apply_model(model, params, batch, input_key, rng, train)
  batch_size, k, dim = z_BxKxP.shape
  w_B = batch["example_weights"]
  cands_NxP = jnp.swapaxes(z_BxKxP[:, 1:], 0, 1).reshape(-1, dim)  # positives, then negatives
  sums_fn = lambda q, c: retrieval_sums(q, c, w_B, jnp.tile(w_B, k - 1), temperature)
  return matryoshka.nested_sums(sums_fn, prefixes, z_BxKxP[:, 0], cands_NxP)


def simcse_sums(a_BxP, b_BxP, temperature: float) -> Sums:
  """Two views of a batch, row i the positive of row i: symmetric InfoNCE and top-1 hits."""
  n = jnp.float32(a_BxP.shape[0])
  hits_B = jnp.argmax(a_BxP @ b_BxP.T, -1) == jnp.arange(a_BxP.shape[0])
  return {"loss_sum": info_nce_loss(a_BxP, b_BxP, temperature) * n, "loss_weight": n,
          "correct": jnp.sum(hits_B)}


def contrastive_features(tokenizer, seq_len: int):
  """text, its positive text_b and (where the columns exist) its hard negatives: [K, L]; a
  text alone (no text_b column): [L], its positive is itself under other dropout."""
  def fn(ex):
    if "text_b" not in ex:
      return {**records.encode(tokenizer, as_text(ex["text"]), None, seq_len),
              "example_weights": np.float32(1.0)}
    columns = ["text", "text_b", *records.negative_columns(ex)]
    texts = [as_text(ex[k]) for k in columns]
    rows = [records.encode(tokenizer, t, None, seq_len) for t in texts]
    return {**records.stacked(rows), "example_weights": np.float32(1.0)}
  return fn


def retrieval_summary(sums) -> dict[str, float]:
  """loss, accuracy; with ranks, MRR and recall@k."""
  out = loss_summary(sums)
  if "rr_sum" in sums:
    weight = max(float(sums["loss_weight"]), 1e-9)
    out["mrr"] = float(sums["rr_sum"]) / weight
    out.update({k.replace("hits_at", "recall_at"): float(v) / weight
                for k, v in sums.items() if k.startswith("hits_at_")})
  return out


class Contrastive(Family):
  names = ("contrastive",)
  # projection_dim 0: no head, the pooled vectors are the embedding (as retrieval uses them)
  options = {"projection_dim": 128, "temperature": 0.05,
             "matryoshka_dims": (), "matryoshka_weights": ()}  # e.g. (384, 256, 128, 64)
  exclusive = ("matryoshka_dims", "matryoshka_weights")
  record_columns = {"contrastive": ("text",)}
  predicts = {"contrastive": "vectors"}

  def check(self, name, config) -> None:
    data, kind = config.data, kinds.kind_of(config.data.kind)
    if data.views not in VIEWS or (data.views == "halves" and not (kind.corpus or kind.records)):
      raise ValueError(f"data.views={data.views!r} with data.kind={data.kind!r}: views "
                       "are 'dropout' (SimCSE: a text twice) or, for text_corpus / text_records "
                       "texts, 'halves' (a text's first and second half)")
    if config.projection_dim < 0:
      raise ValueError(f"projection_dim={config.projection_dim}: 0 (no head) or more")
    dims = config.projection_dim or config.model.emb_dim
    matryoshka.Prefixes.from_config(config).check(dims)

  def task_options(self, name, config) -> dict[str, Any]:
    return {"projection_dim": config["projection_dim"], "temperature": config["temperature"],
            "prefixes": matryoshka.Prefixes.from_config(config)}

  def build(self, name, cfg, *, num_classes=2, projection_dim: int = 128,
            temperature: float = 0.05, prefixes=matryoshka.Prefixes()) -> Task:
    prefixes.check(projection_dim or cfg.emb_dim)
    model, input_key = EncoderContrastive(cfg, projection_dim), INPUT_KEYS[cfg.input_kind]
    def loss_fn(params, batch, rng, train):
      if is_grouped(cfg, batch[input_key]):
        sums = supervised_sums(model, params, batch, input_key, rng, train, temperature,
                               prefixes)
        return mean_loss(sums), sums
      # SimCSE: two dropout views of the same batch are positives.
      rng_a, rng_b = jax.random.split(rng)
      z_a = apply_model(model, params, batch, input_key, rng_a, train)
      z_b = apply_model(model, params, batch, input_key, rng_b, train)
      sums_fn = lambda a, b: simcse_sums(a, b, temperature)
      sums = matryoshka.nested_sums(sums_fn, prefixes, z_a, z_b)
      return mean_loss(sums), sums
    return Task(name, model, input_key, loss_fn, self)

  def summarize(self, name, sums) -> dict[str, float]:
    """loss, accuracy (the positive ranked first); with groups, MRR and recall@k; each
    Matryoshka prefix's too, named `metric@dims`."""
    return {f"{k}{suffix}": v for suffix, part in matryoshka.by_dims(sums).items()
            for k, v in retrieval_summary(part).items()}

  def metric_mode(self, metric: str) -> str:
    return super().metric_mode(matryoshka.plain_metric(metric))

  def pipeline(self, name, config, source, tokenizer, *, train, batch_size, read, kind,
               features=None):
    if config.data.views == "dropout":
      return kind.pipeline(config, tokenizer, source, train=train, batch_size=batch_size,
                           read=read, features=features)
    from jaxencoder.data import span_views  # lazy: tasks import without grain
    return span_views.halves_pipeline(source, tokenizer, seq_len=config.data.seq_len,
                                      batch_size=batch_size,
                                      read=dataclasses.replace(read, drop_remainder=train))

  def record_features(self, name, tokenizer, seq_len, *, num_labels):
    return contrastive_features(tokenizer, seq_len)

  def batch_shapes(self, name, config, batch, *, train, group, kind):
    data, weights = config.data, {"example_weights": ((batch,), np.float32)}
    if data.views == "halves":
      return {**text_shapes((batch, 2, data.seq_len), config), **weights}
    if not kind.records:
      return None
    group = group or PAIR
    rows = (batch, data.seq_len) if group == 1 else (batch, group, data.seq_len)
    return record_shapes(text_shapes(rows, config), batch, train=train)

  def predict(self, name, predictor, batch, args, lines):
    return pooled_vectors(predictor, args)

  def embedding(self, name, config) -> Embedding:
    """Cosine (InfoNCE on unit vectors). Matryoshka prefixes count only without a
    projection head: with one they are the head's, which is for training only."""
    if config.get("projection_dim", self.options["projection_dim"]):
      return Embedding("cosine")
    prefixes = matryoshka.Prefixes.from_config(config)
    weights = prefixes.weights or (1.0,) * len(prefixes.dims)
    trained = tuple(d for d, w in zip(prefixes.dims, weights) if w > 0)
    return Embedding("cosine", trained if trained[1:] else ())


FAMILY = Contrastive()
