"""Baselines beside configs/token_classify.py and configs/classify.py, on their splits.

  python bench/baselines_text.py [--data-dir data]

wsj_pos: the majority tag, and each word's most frequent train tag (unseen words: the
majority tag), scored on the held-out sentences' words. fine_foods: the majority class,
and TF-IDF (lower-cased word unigrams + bigrams seen in >= 2 train reviews, the 20k most
frequent; sublinear tf, idf, rows L2-normalised) + logistic regression (L-BFGS; L2
picked on the last 10% of train from a small grid, then refitted on all of train).
`--simcse [RUN ...]`: configs/contrastive.py's measure instead (`pair_retrieval`); with
`--dims 384,256,128,64`, at each of those prefix sizes (Matryoshka: each prefix of the
embedding re-normalised), one line per size.
Sources are fetched on first use (jaxencoder.data.fetch). One JSON line each.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import tempfile
import time

import numpy as np
from scipy import optimize, sparse

from jaxencoder.data import fetch, readers

_WORD = re.compile(r"[a-z0-9']+")


def wsj_pos(data_dir) -> list[dict]:
  raw = fetch.fetch("wsj_pos", data_dir)
  train, test = ([(w, t) for s in readers.read_tagged(raw / f"{split}.txt")
                  for w, t in zip(s["words"], s["tags"])] for split in ("train", "test"))
  majority = collections.Counter(t for _, t in train).most_common(1)[0][0]
  by_word = collections.defaultdict(collections.Counter)
  for w, t in train:
    by_word[w][t] += 1
  per_word = {w: c.most_common(1)[0][0] for w, c in by_word.items()}
  score = lambda guess: round(float(np.mean([guess(w) == t for w, t in test])), 4)
  base = {"data": "wsj_pos", "metric": "token accuracy", "train_words": len(train),
          "test_words": len(test)}
  return [{**base, "baseline": "majority tag", "test_accuracy": score(lambda w: majority)},
          {**base, "baseline": "most frequent tag per word",
           "test_accuracy": score(lambda w: per_word.get(w, majority))}]


def ngrams(text: str) -> list[str]:
  words = _WORD.findall(text.lower())
  return words + [f"{a} {b}" for a, b in zip(words, words[1:])]


def tfidf(train_texts, test_texts, *, min_df: int = 2, max_features: int = 20000):
  """(train [N, V], test [M, V]) float32 TF-IDF rows; the vocabulary comes from train."""
  docs = [collections.Counter(ngrams(t)) for t in train_texts]
  df = collections.Counter(g for d in docs for g in d)
  vocab = [g for g, n in df.most_common(max_features) if n >= min_df]
  index = {g: i for i, g in enumerate(vocab)}
  idf_V = np.log((1 + len(docs)) / (1 + np.array([df[g] for g in vocab]))) + 1

  def rows(counters):
    x = np.zeros((len(counters), len(vocab)), np.float32)
    for r, counts in enumerate(counters):
      for g, n in counts.items():
        if g in index:
          x[r, index[g]] = 1 + np.log(n)
    x *= idf_V
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)

  return rows(docs), rows([collections.Counter(ngrams(t)) for t in test_texts])


def fine_foods(data_dir) -> list[dict]:
  raw = fetch.fetch("fine_foods", data_dir)
  train, test = (list(readers.read_classification(raw / f"{split}.csv"))
                 for split in ("train", "test"))
  labels = sorted({r["label"] for r in train})
  y_tr, y_te = (np.array([labels.index(r["label"]) for r in rows]) for rows in (train, test))
  start = time.perf_counter()
  fit_tr = int(0.9 * len(train))
  x_fit, x_val = tfidf([r["text"] for r in train[:fit_tr]], [r["text"] for r in train[fit_tr:]])
  val = {l2: _accuracy(x_fit, y_tr[:fit_tr], x_val, y_tr[fit_tr:], len(labels), l2)
         for l2 in (0.0, 1e-6, 1e-5, 1e-4, 1e-3)}
  best = max(val, key=val.get)
  x_tr, x_te = tfidf([r["text"] for r in train], [r["text"] for r in test])
  acc = _accuracy(x_tr, y_tr, x_te, y_te, len(labels), best)
  base = {"data": "fine_foods", "metric": "accuracy", "train": len(train), "test": len(test)}
  majority = np.bincount(y_tr).argmax()
  return [{**base, "baseline": "majority class", "test_accuracy":
           round(float((y_te == majority).mean()), 4)},
          {**base, "baseline": "TF-IDF + logistic regression", "features": x_tr.shape[1],
           "l2": best, "val_accuracy": {str(k): round(v, 4) for k, v in val.items()},
           "test_accuracy": round(acc, 4), "seconds": round(time.perf_counter() - start, 1)}]


def pair_retrieval(data_dir, runs, dims=()) -> list[dict]:
  """Held-out retrieval with TF-IDF, MiniLM and each run's encoder, by cosine (recall@1,
  recall@5, MRR): each test line of `shakespeare_pairs` ranks the split's next lines and
  hard negatives (2 x N candidates); each test speech of `shakespeare_speeches` ranks
  the split's second halves by its first half (cut as data/span_views.py cuts).
  `dims`: the encoders' at each prefix size instead of the full vectors'."""
  from jaxencoder.pretrained.convert import convert
  from jaxencoder.pretrained.sentences import embed
  from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path
  rows = list(readers.read_records(fetch.fetch("shakespeare_pairs", data_dir) / "test.csv"))
  speeches = [r["text"] for r in
              readers.read_records(fetch.fetch("shakespeare_speeches", data_dir) / "test.csv")]
  halves = speech_halves(speeches, Tokenizer.from_file(default_tokenizer_path()))
  next_lines = [r["text_b"] for r in rows] + [r["negative"] for r in rows]
  tasks = {"next line (shakespeare_pairs test)": ([r["text"] for r in rows], next_lines),
           "second half (shakespeare_speeches test)": halves}
  models = {"MiniLM (step 0)": str(default_tokenizer_path())}
  out = []
  for task, (queries, cands) in tasks.items():
    x = tfidf(queries + cands, queries + cands, min_df=1, max_features=50000)[1]
    out.append({"data": task, "queries": len(queries), "candidates": len(cands),
                "model": "TF-IDF", **_ranks(x[:len(queries)], x[len(queries):])})
  with tempfile.TemporaryDirectory() as tmp:
    for i, run in enumerate(runs):  # the run's encoder as a Hugging Face dir, for `embed`
      convert(run, f"{tmp}/{i}")
      models[run] = f"{tmp}/{i}"
    for name, model_dir in models.items():
      for task, (queries, cands) in tasks.items():
        emb = lambda texts: embed(texts, model_dir, max_length=32, progress=False)
        q_NxD, c_MxD = emb(queries), emb(cands)
        for size in [d for d in dims if d <= q_NxD.shape[1]] or [q_NxD.shape[1]]:
          out.append({"data": task, "queries": len(queries), "candidates": len(cands),
                      "model": name, **({"dims": size} if dims else {}),
                      **_ranks(_prefix(q_NxD, size), _prefix(c_MxD, size))})
  return out


def _prefix(x_NxD, size: int):
  """Each row's first `size` values, L2-normalised (so that dot products are cosines)."""
  x_NxS = x_NxD[:, :size]
  return x_NxS / np.maximum(np.linalg.norm(x_NxS, axis=1, keepdims=True), 1e-12)


def speech_halves(texts, tokenizer, seq_len: int = 32) -> tuple[list[str], list[str]]:
  """(first halves, second halves) of `texts`, cut where training at `seq_len` cuts them:
  span_views.split_point on the first 2 x seq_len - 2 tokens (`embed` then keeps each
  half's first seq_len - 2)."""
  from jaxencoder.data.span_views import split_point
  firsts, seconds = [], []
  for text in texts:
    enc = tokenizer.encode(text, offsets=True)
    cut = split_point(np.asarray(enc["word_ids"][1:-1][:2 * seq_len - 2]))
    at = int(enc["offsets"][1 + cut][0]) if cut else len(text)
    firsts.append(text[:at].strip())
    seconds.append(text[at:].strip() or text)
  return firsts, seconds


def _ranks(q_NxD, c_MxD) -> dict:
  """Metrics of query i's positive, candidate i, among all M candidates."""
  sim_NxM = q_NxD @ c_MxD.T
  rank_N = 1 + (sim_NxM > np.diag(sim_NxM[:, :len(q_NxD)])[:, None]).sum(1)
  return {"recall_at_1": round(float((rank_N == 1).mean()), 4),
          "recall_at_5": round(float((rank_N <= 5).mean()), 4),
          "mrr": round(float((1 / rank_N).mean()), 4)}


def _accuracy(x_tr, y_tr, x_te, y_te, num_classes: int, l2: float) -> float:
  """Softmax regression fitted with L-BFGS on the sparse rows; test accuracy."""
  y_NxC = np.eye(num_classes)[y_tr]
  x_tr = sparse.csr_matrix(x_tr)

  def loss_and_grad(flat):
    w_VxC = flat[:-num_classes].reshape(-1, num_classes)
    logits_NxC = x_tr @ w_VxC + flat[-num_classes:]
    logits_NxC -= logits_NxC.max(1, keepdims=True)
    p_NxC = np.exp(logits_NxC)
    p_NxC /= p_NxC.sum(1, keepdims=True)
    nll = -np.mean(np.sum(y_NxC * np.log(p_NxC + 1e-12), 1)) + l2 * np.sum(w_VxC ** 2)
    g_NxC = (p_NxC - y_NxC) / len(y_tr)
    grad_w = x_tr.T @ g_NxC + 2 * l2 * w_VxC
    return nll, np.concatenate([grad_w.ravel(), g_NxC.sum(0)])

  size = x_tr.shape[1] * num_classes + num_classes
  flat = optimize.minimize(loss_and_grad, np.zeros(size), jac=True, method="L-BFGS-B",
                           options={"maxiter": 500}).x
  w_VxC, b_C = flat[:-num_classes].reshape(-1, num_classes), flat[-num_classes:]
  return float((np.argmax(x_te @ w_VxC + b_C, -1) == y_te).mean())


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data-dir", default="data")
  parser.add_argument("--simcse", nargs="*", metavar="RUN",
                      help="instead: next-line retrieval on shakespeare_pairs' test split with "
                           "MiniLM, TF-IDF and each RUN's encoder (configs/contrastive.py)")
  parser.add_argument("--dims", type=lambda text: tuple(int(d) for d in text.split(",")),
                      default=(), metavar="D1,D2,...",
                      help="with --simcse: the encoders' retrieval at each prefix size")
  args = parser.parse_args()
  if args.simcse is not None:
    for record in pair_retrieval(args.data_dir, args.simcse, args.dims):
      print(json.dumps(record), flush=True)
    return
  for task in (wsj_pos, fine_foods):
    for record in task(args.data_dir):
      print(json.dumps(record), flush=True)


if __name__ == "__main__":
  main()
