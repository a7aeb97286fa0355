"""Contrastive sentence embeddings (task `contrastive`): SimCSE on single texts [B, L] (two
dropout views of a text are positives), or supervised on groups [B, K, L] (text,
positive[, hard negative]) against the batch's positives and negatives, with recall@k and
MRR. `data.views="halves"`: a text's first half's positive is its second half.
`matryoshka_dims`: the loss summed over nested prefixes of the vectors (tasks/matryoshka.py),
with metrics at each size (`mrr@128`). `symmetric`: the supervised InfoNCE averaged over
both directions, query -> candidates and positive -> the batch's queries (SimCSE's loss is
symmetric already: its two views are interchangeable).
`contrastive_loss="cosent"` (task `contrastive_cosent`): CoSENT on scored pairs (text,
text_b, score: eval_sts's columns), its scale 1 / temperature (0.05: 20), with Spearman's
rho of the pairs' cosines against their scores over the eval split.

The loss is one over the whole batch's embeddings (`embedding_task`): with
optim.grad_accum_steps=k, the k micro-batches train as one batch (steps.cached_gradients).

text_records columns: text, [text_b, [negative | negative_1 .. negative_k]]; arrays: text
arrays [K, L] (K = 2 + the hard negatives: one `negative`, or the k of a mined set,
`jaxencoder-data mine`), or [L] for a text alone (SimCSE). contrastive_cosent: text, text_b,
score; arrays [2, L] and targets float32.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxencoder.data import kinds, records
from jaxencoder.data.readers import as_text
from jaxencoder.model.heads import (EncoderContrastive, cosine_similarity, info_nce_loss,
                                    is_grouped)
from jaxencoder.tasks import matryoshka, regression
from jaxencoder.tasks.base import (INPUT_KEYS, MASKED, Embedding, Family, Sums, Task,
                                   apply_model, embedding_task, loss_summary,
                                   masked_cross_entropy, mean_loss, per_example, pooled_vectors,
                                   record_shapes, text_shapes)

RECALL_AT = (1, 5)
VIEWS = ("dropout", "halves")
PAIR = 2  # texts per text_records example where no data says it: a text and its positive
LOSSES = {"info_nce": "contrastive", "cosent": "contrastive_cosent"}  # contrastive_loss -> task


def retrieval_sums(query_BxP, cands_NxP, weights_B, cand_weights_N, temperature: float,
                   ks=RECALL_AT, *, symmetric: bool = False) -> Sums:
  """InfoNCE of query b against candidate b (N >= B candidates: the B positives, then
  hard negatives; candidates of weight 0 are never chosen), and the rank of the positive
  among the candidates: `correct` (rank 1), `hits_at_k`, `rr_sum` (reciprocal ranks).
  `symmetric`: each row's loss the mean of that and positive b's InfoNCE against the
  batch's queries (document -> query; queries of weight 0 never chosen)."""
  w_B = weights_B.astype(jnp.float32)
  sim_BxN = query_BxP.astype(jnp.float32) @ cands_NxP.astype(jnp.float32).T
  labels_B = jnp.arange(sim_BxN.shape[0])
  valid_1xN = cand_weights_N[None, :] > 0
  ce_B = masked_cross_entropy(sim_BxN / temperature, labels_B, valid_1xN)
  if symmetric:
    sim_BxB = sim_BxN[:, :sim_BxN.shape[0]].T  # [positive, query]
    ce_B = (ce_B + masked_cross_entropy(sim_BxB / temperature, labels_B, w_B[None, :])) / 2
  positive_Bx1 = jnp.take_along_axis(sim_BxN, labels_B[:, None], -1)
  rank_B = 1 + jnp.sum(valid_1xN & (sim_BxN > positive_Bx1), -1)
  sums = {"loss_sum": jnp.sum(ce_B * w_B), "loss_weight": jnp.sum(w_B),
          "correct": jnp.sum((rank_B == 1) * w_B), "rr_sum": jnp.sum(w_B / rank_B)}
  sums.update({f"hits_at_{k}": jnp.sum((rank_B <= k) * w_B) for k in ks})
  return sums


def supervised_sums(z_BxKxP, weights_B, temperature: float, prefixes=matryoshka.Prefixes(),
                    *, symmetric: bool = False) -> Sums:
  """Text k=0 of each group against every positive (k=1) and hard negative (k=2) of the
  batch: InfoNCE and retrieval sums (and each prefix's)."""
  _, k, dim = z_BxKxP.shape
  cands_NxP = jnp.swapaxes(z_BxKxP[:, 1:], 0, 1).reshape(-1, dim)  # positives, then negatives
  sums_fn = lambda q, c: retrieval_sums(q, c, weights_B, jnp.tile(weights_B, k - 1),
                                        temperature, symmetric=symmetric)
  return matryoshka.nested_sums(sums_fn, prefixes, z_BxKxP[:, 0], cands_NxP)


def simcse_sums(a_BxP, b_BxP, temperature: float) -> Sums:
  """Two views of a batch, row i the positive of row i: symmetric InfoNCE and top-1 hits."""
  n = jnp.float32(a_BxP.shape[0])
  hits_B = jnp.argmax(a_BxP @ b_BxP.T, -1) == jnp.arange(a_BxP.shape[0])
  return {"loss_sum": info_nce_loss(a_BxP, b_BxP, temperature) * n, "loss_weight": n,
          "correct": jnp.sum(hits_B)}


def cosent_sums(a_BxP, b_BxP, scores_B, weights_B, scale: float) -> Sums:
  """CoSENT (Su 2022) of pairs (a_i, b_i) scored s_i: the batch's one loss
  log(1 + sum over s_i > s_j of exp(scale (cos_j - cos_i))), as a mean over its rows
  (loss_sum = loss x weight); rows of weight 0 take no part. `correct` is 0 (no accuracy)."""
  w_B, s_B = weights_B.astype(jnp.float32), scores_B.astype(jnp.float32)
  cos_B = cosine_similarity(a_BxP, b_BxP)
  real_B = w_B > 0
  ordered_BxB = (s_B[:, None] > s_B[None, :]) & real_B[:, None] & real_B[None, :]
  diff_BxB = jnp.where(ordered_BxB, scale * (cos_B[None, :] - cos_B[:, None]), MASKED)
  loss = jax.nn.logsumexp(jnp.concatenate([jnp.zeros(1), diff_BxB.reshape(-1)]))
  weight = jnp.sum(w_B)
  return {"loss_sum": loss * weight, "loss_weight": weight,
          "correct": jnp.zeros((), jnp.float32)}


def scored_pair_sums(z_Bx2xP, batch, scale: float, prefixes=matryoshka.Prefixes()) -> Sums:
  """CoSENT sums of a batch of scored pairs (each prefix's too); in eval (rows numbered),
  each pair's cosine and score ranked for Spearman (tasks/regression.py)."""
  scores_B, w_B = batch["targets"], batch["example_weights"]
  def sums_fn(a_BxP, b_BxP):
    sums = cosent_sums(a_BxP, b_BxP, scores_B, w_B, scale)
    if "example_index" in batch:
      sums.update(regression.ranked_sums(cosine_similarity(a_BxP, b_BxP), scores_B, w_B,
                                         batch["example_index"]))
    return sums
  return matryoshka.nested_sums(sums_fn, prefixes, z_Bx2xP[:, 0], z_Bx2xP[:, 1])


def contrastive_features(tokenizer, seq_len: int, *, scored: bool = False):
  """text, its positive text_b and (where the columns exist) its hard negatives: [K, L]; a
  text alone (no text_b column): [L], its positive is itself under other dropout.
  `scored`: a pair and its `targets` (the score column, as eval_sts reads it)."""
  def fn(ex):
    if scored:
      rows = [records.encode(tokenizer, as_text(ex[k]), None, seq_len) for k in ("text", "text_b")]
      return {**records.stacked(rows), "targets": np.float32(ex["score"]),
              "example_weights": np.float32(1.0)}
    if "text_b" not in ex:
      return {**records.encode(tokenizer, as_text(ex["text"]), None, seq_len),
              "example_weights": np.float32(1.0)}
    columns = ["text", "text_b", *records.negative_columns(ex)]
    texts = [as_text(ex[k]) for k in columns]
    rows = [records.encode(tokenizer, t, None, seq_len) for t in texts]
    return {**records.stacked(rows), "example_weights": np.float32(1.0)}
  return fn


def scored_summary(sums) -> dict[str, float]:
  """loss; Spearman's rho of cosines against scores when the sums rank the split."""
  out = {"loss": loss_summary(sums)["loss"]}
  if "ranked_count" in sums:
    filled = np.asarray(sums["ranked_count"]) == 1
    out["spearman"] = regression.spearman(np.asarray(sums["ranked_pred"])[filled],
                                          np.asarray(sums["ranked_target"])[filled])
  return out


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
  names = tuple(LOSSES.values())
  # projection_dim 0: no head, the pooled vectors are the embedding (as retrieval uses them)
  options = {"projection_dim": 128, "temperature": 0.05, "symmetric": False,
             "contrastive_loss": "info_nce",  # or "cosent" (task contrastive_cosent)
             "matryoshka_dims": (), "matryoshka_weights": ()}  # e.g. (384, 256, 128, 64)
  exclusive = ("symmetric", "contrastive_loss", "matryoshka_dims", "matryoshka_weights")
  record_columns = {"contrastive": ("text",), "contrastive_cosent": ("text", "text_b", "score")}
  predicts = {name: "vectors" for name in names}

  def resolve(self, config) -> str:
    loss = config.get("contrastive_loss", "info_nce")
    if loss not in LOSSES:
      raise ValueError(f"contrastive_loss={loss!r} is not one of {tuple(LOSSES)}")
    return LOSSES[loss] if config["task"] == "contrastive" else config["task"]

  def check(self, name, config) -> None:
    data, kind = config.data, kinds.kind_of(config.data.kind)
    if data.views not in VIEWS or (data.views == "halves" and not (kind.corpus or kind.records)):
      raise ValueError(f"data.views={data.views!r} with data.kind={data.kind!r}: views "
                       "are 'dropout' (SimCSE: a text twice) or, for text_corpus / text_records "
                       "texts, 'halves' (a text's first and second half)")
    if name == "contrastive_cosent" and (data.views != "dropout" or not kind.records
                                         or config.get("symmetric", False)):
      raise ValueError("contrastive_loss='cosent' reads scored pairs (text, text_b, score) "
                       "of data.kind='text_records' with data.views='dropout' and "
                       "symmetric=False (an InfoNCE option)")
    if config.projection_dim < 0:
      raise ValueError(f"projection_dim={config.projection_dim}: 0 (no head) or more")
    dims = config.projection_dim or config.model.emb_dim
    matryoshka.Prefixes.from_config(config).check(dims)

  def task_options(self, name, config) -> dict[str, Any]:
    return {"projection_dim": config["projection_dim"], "temperature": config["temperature"],
            "prefixes": matryoshka.Prefixes.from_config(config),
            "symmetric": config.get("symmetric", False)}

  def build(self, name, cfg, *, num_classes=2, projection_dim: int = 128,
            temperature: float = 0.05, prefixes=matryoshka.Prefixes(),
            symmetric: bool = False) -> Task:
    prefixes.check(projection_dim or cfg.emb_dim)
    model, input_key = EncoderContrastive(cfg, projection_dim), INPUT_KEYS[cfg.input_kind]

    def embed_fn(params, batch, rng, train):
      """[B, K, P] of groups; SimCSE: two dropout views [B, P] of the same batch."""
      if is_grouped(cfg, batch[input_key]):
        return apply_model(model, params, batch, input_key, rng, train)
      rng_a, rng_b = jax.random.split(rng)
      return tuple(apply_model(model, params, batch, input_key, r, train) for r in (rng_a, rng_b))

    def embedding_loss_fn(z, batch):
      if name == "contrastive_cosent":
        sums = scored_pair_sums(z, batch, 1 / temperature, prefixes)
      elif is_grouped(cfg, batch[input_key]):
        sums = supervised_sums(z, batch["example_weights"], temperature, prefixes,
                               symmetric=symmetric)
      else:
        sums = matryoshka.nested_sums(lambda a, b: simcse_sums(a, b, temperature), prefixes, *z)
      return mean_loss(sums), sums
    return embedding_task(name, model, input_key, self, embed_fn, embedding_loss_fn)

  def summarize(self, name, sums) -> dict[str, float]:
    """loss, accuracy (the positive ranked first); with groups, MRR and recall@k; each
    Matryoshka prefix's too, named `metric@dims`."""
    summary = scored_summary if name == "contrastive_cosent" else retrieval_summary
    return {f"{k}{suffix}": v for suffix, part in matryoshka.by_dims(sums).items()
            for k, v in summary(part).items()}

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
    return contrastive_features(tokenizer, seq_len, scored=name == "contrastive_cosent")

  def batch_shapes(self, name, config, batch, *, train, group, kind):
    data, weights = config.data, {"example_weights": ((batch,), np.float32)}
    if data.views == "halves":
      return {**text_shapes((batch, 2, data.seq_len), config), **weights}
    if not kind.records:
      return None
    if name == "contrastive_cosent":
      arrays = {**text_shapes((batch, PAIR, data.seq_len), config),
                **per_example(batch, targets=np.float32)}
      return record_shapes(arrays, batch, train=train)
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
