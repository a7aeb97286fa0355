"""The metrics retrieval work reports, from ranked corpus ids and judgements (numpy); STS's
Spearman is jaxencoder/rank_correlation.py's.

  ndcg@10     sum of gain / log2(rank + 1) over the top 10, over the same for the ideal
              order of the query's judgements; gain = the judged score (graded, as
              trec_eval / pytrec_eval, which BEIR uses)
  mrr@10      1 / the rank of the first relevant document (score > 0) in the top 10, else 0
  recall@100  the share of the query's relevant documents in its top 100

Each retrieval metric is the mean over the queries with at least one relevant document
(`per_query` gives each query's). `paired_bootstrap` puts an interval on the difference of
two models' means over the same queries.
"""

from __future__ import annotations

import numpy as np

NDCG_AT, MRR_AT, RECALL_AT = 10, 10, 100
DEPTH = max(NDCG_AT, MRR_AT, RECALL_AT)  # ranks a search must return
NAMES = (f"ndcg@{NDCG_AT}", f"mrr@{MRR_AT}", f"recall@{RECALL_AT}")


def ranking_metrics(ranked_QxK: np.ndarray, qrels: list[dict[int, int]]) -> dict[str, float]:
  """NAMES' means of corpus ids ranked best first per query (-1: no document), against
  qrels[query] = {corpus id: score}."""
  return dict(zip(NAMES, map(float, per_query(ranked_QxK, qrels).mean(0))))


def per_query(ranked_QxK: np.ndarray, qrels: list[dict[int, int]]) -> np.ndarray:
  """NAMES of each query with a relevant document, [Q', 3] in query order (queries without
  one are left out, as in the means)."""
  rows = [_one_query(list(ids), judged) for ids, judged in zip(ranked_QxK, qrels)
          if any(score > 0 for score in judged.values())]
  if not rows:
    raise ValueError("no query has a relevant document (a judgement with score > 0)")
  return np.asarray(rows, np.float64)


def paired_bootstrap(a_Q: np.ndarray, b_Q: np.ndarray, *, samples: int = 10_000,
                     level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
  """(mean(b - a), low, high): the percentile interval at `level` of the mean difference
  over `samples` resamplings of the queries with replacement, the same queries for both
  models (paired)."""
  diff_Q = np.asarray(b_Q, np.float64) - np.asarray(a_Q, np.float64)
  if diff_Q.ndim != 1 or not len(diff_Q):
    raise ValueError(f"paired_bootstrap needs two equal-length 1-d score arrays, got shapes "
                     f"{np.shape(a_Q)} and {np.shape(b_Q)}")
  picks_SxQ = np.random.default_rng(seed).integers(0, len(diff_Q), (samples, len(diff_Q)))
  means_S = diff_Q[picks_SxQ].mean(1)
  tail = (1 - level) / 2
  low, high = np.quantile(means_S, [tail, 1 - tail])
  return float(diff_Q.mean()), float(low), float(high)


def _one_query(ids: list[int], judged: dict[int, int]) -> tuple[float, float, float]:
  gains = [max(judged.get(d, 0), 0) for d in ids[:NDCG_AT]]
  ideal = sorted((s for s in judged.values() if s > 0), reverse=True)[:NDCG_AT]
  discount = lambda values: sum(g / np.log2(rank + 2) for rank, g in enumerate(values))
  first = next((rank for rank, d in enumerate(ids[:MRR_AT]) if judged.get(d, 0) > 0), None)
  relevant = {d for d, s in judged.items() if s > 0}
  return (discount(gains) / discount(ideal), 0.0 if first is None else 1 / (first + 1),
          len(relevant & set(ids[:RECALL_AT])) / len(relevant))
