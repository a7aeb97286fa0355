"""The embedding recipe's measure (configs/retrieval_minilm.py, docs/results.md): each
model's ndcg@10, mrr@10 and recall@100 on a held-out BEIR-format retrieval set, and the
paired bootstrap interval of the ndcg@10 difference of every pair of models.

  python bench/embedding_recipe.py --retrieval data/raw/shakespeare_retrieval \\
      minilm inbatch=runs/inbatch mined=runs/mined gradcache=runs/gradcache

Each MODEL is a name jaxencoder.load takes (minilm, a directory, RUN or RUN@STEP), or
LABEL=MODEL. The models embed as jaxencoder.load(MODEL).embed does; the search is exact
over the whole corpus. The interval resamples the queries (--samples times, with
replacement, the same queries for both models): it covers the choice of queries, not the
training run's seed. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import itertools
import time

import jaxencoder
from jaxencoder.data import beir, fetch
from jaxencoder.retrieval import evaluate, metrics


def scores(model: str, found: beir.RetrievalSet, batch_size: int):
  """Per-query [Q', 3] metrics (metrics.NAMES) of `model` on `found`, and its wall time."""
  start = time.perf_counter()
  loaded = jaxencoder.load(model)
  ranked_QxK = evaluate.ranked(lambda texts: loaded.embed(texts, batch_size=batch_size), found)
  return metrics.per_query(ranked_QxK, found.qrels), time.perf_counter() - start


def table(labels: list[str], per_query: list, *, samples: int) -> str:
  """Two markdown tables: each model's means, then every pair's ndcg@10 difference (later
  minus earlier) with its paired bootstrap interval."""
  lines = ["| model | " + " | ".join(metrics.NAMES) + " |", "|---" * (len(metrics.NAMES) + 1)
           + "|"]
  lines += [f"| {label} | " + " | ".join(f"{v:.4f}" for v in rows_Qx3.mean(0)) + " |"
            for label, rows_Qx3 in zip(labels, per_query)]
  lines += ["", f"| difference | {metrics.NAMES[0]} | 95% paired bootstrap interval |",
            "|---|---|---|"]
  for i, j in itertools.combinations(range(len(labels)), 2):
    mean, low, high = metrics.paired_bootstrap(per_query[i][:, 0], per_query[j][:, 0],
                                               samples=samples)
    lines.append(f"| {labels[j]} - {labels[i]} | {mean:+.4f} | [{low:+.4f}, {high:+.4f}] |")
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("models", nargs="+", help="MODEL or LABEL=MODEL")
  parser.add_argument("--retrieval", default="", help="a BEIR-format folder (default: "
                      "shakespeare_retrieval, fetched into --data-dir)")
  parser.add_argument("--data-dir", default="data")
  parser.add_argument("--samples", type=int, default=10_000, help="bootstrap resamplings")
  parser.add_argument("--batch-size", type=int, default=64)
  args = parser.parse_args()
  found = beir.read(args.retrieval or fetch.fetch("shakespeare_retrieval", args.data_dir))
  labels, per_query = [], []
  for spec in args.models:
    label, _, model = spec.rpartition("=")
    rows_Qx3, wall = scores(model, found, args.batch_size)
    print(f"{label or model}: ndcg@10 {rows_Qx3[:, 0].mean():.4f} ({wall:.0f} s)", flush=True)
    labels.append(label or model)
    per_query.append(rows_Qx3)
  print(f"\n{len(found.queries)} queries, {len(found.corpus)} documents\n")
  print(table(labels, per_query, samples=args.samples))


if __name__ == "__main__":
  main()
