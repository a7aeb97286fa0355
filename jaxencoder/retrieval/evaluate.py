"""Retrieval and STS evaluation of any embedding function `embed(texts) -> [N, D]`.

  evals = Evaluators.read(retrieval="DIR", sts="FILE")  # files read (and checked) once
  metrics = evals(jaxencoder.load("minilm").embed)  # {"ndcg@10", "mrr@10", "recall@100", "spearman"}

Retrieval: queries and corpus embedded, each query's top DEPTH documents by inner product
(embed's vectors: unit length, so cosine) searched exactly over the whole corpus
(search.top_k, in blocks on device), scored against the judgements (metrics.py). STS: the
cosine of each pair's vectors, rank-correlated with the gold scores. jaxencoder-eval runs
it on a model, train.py at every eval (config keys eval_retrieval, eval_sts).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence

import numpy as np

from jaxencoder.data import beir, scored_pairs
from jaxencoder.rank_correlation import spearman
from jaxencoder.retrieval import metrics, search

Embed = Callable[[Sequence[str]], np.ndarray]


@dataclasses.dataclass
class Evaluators:
  """A retrieval set and scored pairs (either may be None), read once, evaluated often."""
  retrieval: beir.RetrievalSet | None = None
  sts: scored_pairs.ScoredPairs | None = None
  block: int = search.BLOCK  # corpus rows searched at once

  @classmethod
  def read(cls, retrieval="", sts="", **options) -> Evaluators:
    """The retrieval set in folder `retrieval` and the scored pairs in file `sts` ("":
    none); a missing or malformed file is one line naming it."""
    return cls(beir.read(retrieval) if retrieval else None,
               scored_pairs.read(sts) if sts else None, **options)

  def __bool__(self) -> bool:
    return self.retrieval is not None or self.sts is not None

  def __call__(self, embed: Embed) -> dict[str, float]:
    out = {}
    if self.retrieval is not None:
      out.update(retrieval_metrics(embed, self.retrieval, block=self.block))
    if self.sts is not None:
      out["spearman"] = sts_spearman(embed, self.sts)
    return out


def retrieval_metrics(embed: Embed, found: beir.RetrievalSet, *,
                      block: int = search.BLOCK) -> dict[str, float]:
  """ndcg@10, mrr@10 and recall@100 of `embed` on a retrieval set, over its whole corpus."""
  return metrics.ranking_metrics(ranked(embed, found, block=block), found.qrels)


def ranked(embed: Embed, found: beir.RetrievalSet, *, block: int = search.BLOCK) -> np.ndarray:
  """Each query's top metrics.DEPTH corpus ids [Q, DEPTH], best first (exact search)."""
  queries_QxD, corpus_NxD = embed(found.queries), embed(found.corpus)
  return search.top_k(queries_QxD, corpus_NxD, metrics.DEPTH, block=block)[1]


def sts_spearman(embed: Embed, pairs: scored_pairs.ScoredPairs) -> float:
  """Spearman's correlation of the pairs' cosine similarities with their gold scores."""
  unit = lambda x: x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
  a_NxD, b_NxD = unit(embed(pairs.texts)), unit(embed(pairs.texts_b))
  return spearman(np.sum(a_NxD * b_NxD, -1), pairs.scores)


def report(values: dict[str, float], *, as_json: bool = False) -> str:
  """The metrics as a small table (metric, value), or one JSON object."""
  if as_json:
    return json.dumps(values)
  width = max(map(len, values))
  return "\n".join(f"{name:<{width}}  {value:.4f}" for name, value in values.items())
