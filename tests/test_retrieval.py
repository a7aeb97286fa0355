"""Exact retrieval (jaxencoder/retrieval/): blocked top-k against a numpy sort, the metrics
against hand-computed and direct references, BEIR / scored-pair files, the evaluators,
jaxencoder-eval, hard-negative mining (jaxencoder-data mine) and the Shakespeare halves set."""

import csv
import json
import math

import flax.linen as nn
import jax
import numpy as np
import pytest
import scipy.stats

import jaxencoder
from conftest import tiny_config
from data_helpers import VOCAB, WORDS, tiny_tokenizer
from jaxencoder import Encoder, pretrained
from jaxencoder.data import beir, builders, records, scored_pairs, shakespeare_tasks, sources
from jaxencoder.data.__main__ import main as data_main
from jaxencoder.data.readers import DataError
from jaxencoder import rank_correlation
from jaxencoder.retrieval import metrics, mining, search
from jaxencoder.retrieval.__main__ import main as eval_main
from jaxencoder.retrieval.evaluate import Evaluators, retrieval_metrics, sts_spearman
from jaxencoder.tasks import contrastive


# --- search ------------------------------------------------------------------------------
def numpy_top_k(q, c, k, allowed=None):
  scores = q.astype(np.float64) @ c.T.astype(np.float64)
  if allowed is not None:
    scores = np.where(allowed, scores, -np.inf)
  order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(scores, order, 1), order


@pytest.mark.parametrize("block,query_block", [(64, 5), (1000, 1000), (7, 64)])
def test_blocked_top_k_is_the_exact_sorted_top_k(block, query_block):
  rng = np.random.default_rng(0)
  q, c = rng.normal(size=(13, 16)), rng.normal(size=(300, 16))
  scores, ids = search.top_k(q, c, 10, block=block, query_block=query_block)
  want_scores, want_ids = numpy_top_k(q, c, 10)
  np.testing.assert_array_equal(ids, want_ids)
  np.testing.assert_allclose(scores, want_scores, rtol=1e-5)


def test_top_k_leaves_out_excluded_ids_and_scores_above_the_ceiling():
  rng = np.random.default_rng(1)
  q, c = rng.normal(size=(9, 8)), rng.normal(size=(50, 8))
  exclude = rng.integers(0, 50, size=(9, 2))
  exclude[0, 1] = -1  # none
  ceiling = rng.normal(size=9)
  _, ids = search.top_k(q, c, 6, exclude_QxE=exclude, max_score_Q=ceiling, block=16)
  allowed = (q @ c.T <= ceiling[:, None]) & ~(np.arange(50) == exclude[..., None]).any(1)
  want_scores, want_ids = numpy_top_k(q, c, 6, allowed)
  np.testing.assert_array_equal(ids, np.where(np.isinf(want_scores), -1, want_ids))


def test_top_k_asks_at_most_the_corpus_and_marks_too_few_candidates():
  c = np.eye(3, dtype=np.float32)
  scores, ids = search.top_k(c[:1], c, 10)
  assert ids.tolist() == [[0, 1, 2]] and scores.tolist() == [[1, 0, 0]]
  _, ids = search.top_k(c[:1], c, 3, exclude_QxE=[[1]], max_score_Q=[0.5])
  assert ids.tolist() == [[2, -1, -1]]


# --- metrics -----------------------------------------------------------------------------
def test_ndcg_with_graded_judgements_matches_a_hand_computation():
  # ranked d3, d0, d7, d1; judged d0: 2, d1: 1, d5: 3 (d5 never retrieved)
  got = metrics.ranking_metrics(np.array([[3, 0, 7, 1]]), [{0: 2, 1: 1, 5: 3}])
  dcg = 2 / math.log2(3) + 1 / math.log2(5)
  ideal = 3 / math.log2(2) + 2 / math.log2(3) + 1 / math.log2(4)
  assert got["ndcg@10"] == pytest.approx(dcg / ideal)
  assert got["mrr@10"] == pytest.approx(1 / 2)
  assert got["recall@100"] == pytest.approx(2 / 3)


def test_mrr_and_recall_count_their_cutoffs_and_average_judged_queries():
  ranked = np.arange(120)[None].repeat(3, 0)
  qrels = [{10: 1}, {50: 1, 110: 1}, {4: 0}]  # query 3: no relevant document, left out
  got = metrics.ranking_metrics(ranked, qrels)
  assert got["mrr@10"] == pytest.approx(0.0)  # ranks 11 and 51: past the top 10
  assert got["recall@100"] == pytest.approx((1 + 0.5) / 2)
  assert got["ndcg@10"] == 0.0
  with pytest.raises(ValueError, match="no query has a relevant document"):
    metrics.ranking_metrics(ranked[:1], [{4: 0}])


def test_retrieval_metrics_agree_with_a_direct_numpy_reference():
  rng = np.random.default_rng(2)
  ranked = np.stack([rng.permutation(200) for _ in range(20)])
  qrels = [{int(d): int(rng.integers(1, 4)) for d in rng.choice(200, rng.integers(1, 6),
                                                                  replace=False)}
           for _ in range(20)]
  rel = np.zeros((20, 200))
  for i, judged in enumerate(qrels):
    rel[i, list(judged)] = list(judged.values())
  gains = np.take_along_axis(rel, ranked, 1)
  discount = 1 / np.log2(np.arange(2, 12))
  ideal = -np.sort(-rel, 1)[:, :10] @ discount
  hits = gains > 0
  first = np.where(hits[:, :10].any(1), 1 / (hits[:, :10].argmax(1) + 1), 0)
  want = {"ndcg@10": np.mean(gains[:, :10] @ discount / ideal), "mrr@10": first.mean(),
          "recall@100": np.mean(hits[:, :100].sum(1) / (rel > 0).sum(1))}
  assert metrics.ranking_metrics(ranked, qrels) == pytest.approx(want)


def test_spearman_is_scipys_with_ties_and_zero_for_a_constant_side():
  rng = np.random.default_rng(3)
  a, b = rng.integers(0, 5, 40), rng.normal(size=40)
  assert rank_correlation.spearman(a, b) == pytest.approx(scipy.stats.spearmanr(a, b).statistic)
  assert rank_correlation.spearman(np.ones(5), np.arange(5)) == 0.0


# --- files -------------------------------------------------------------------------------
def tiny_set(folder, docs=("the cat sat", "a dog ran far", "fruit flies like a banana"),
             queries=("cat", "dog"), qrels=None):
  return beir.write(folder, {f"q{i}": t for i, t in enumerate(queries)},
                    {f"d{i}": t for i, t in enumerate(docs)},
                    qrels or {"q0": {"d0": 1}, "q1": {"d1": 2, "d2": 0}})


def test_a_beir_folder_reads_back_with_titles_joined_and_unjudged_queries_dropped(tmp_path):
  tiny_set(tmp_path, queries=("cat", "dog", "unjudged"))
  (tmp_path / "corpus.jsonl").write_text(
      '{"_id": "d0", "title": "Cats", "text": "the cat sat"}\n'
      '{"_id": "d1", "text": "a dog ran far"}\n{"_id": "d2", "text": "fruit"}\n')
  found = beir.read(tmp_path)
  assert found.corpus == ["Cats the cat sat", "a dog ran far", "fruit"]
  assert found.query_ids == ["q0", "q1"] and found.queries == ["cat", "dog"]
  assert found.qrels == [{0: 1}, {1: 2, 2: 0}]


def test_beirs_own_layout_qrels_test_tsv_is_read(tmp_path):
  tiny_set(tmp_path)
  (tmp_path / "qrels").mkdir()
  (tmp_path / "qrels.tsv").rename(tmp_path / "qrels" / "test.tsv")
  assert beir.read(tmp_path).qrels == [{0: 1}, {1: 2, 2: 0}]


@pytest.mark.parametrize("qrels,message", [
    ("query-id\tcorpus-id\tscore\nq0\td0\n", r"qrels.tsv:2: 2 tab-separated fields"),
    ("query-id\tcorpus-id\tscore\nq0\td0\t1\nq0\td9\t1\n",
     r"qrels.tsv:3: corpus-id 'd9' is not in corpus.jsonl"),
    ("query-id\tcorpus-id\tscore\nq0\td0\thigh\n", r"qrels.tsv:2: score 'high' is not"),
    ("q\tc\ts\nq0\td0\t1\n", r"qrels.tsv:1: header"),
])
def test_a_bad_qrels_line_is_one_error_naming_file_and_line(tmp_path, qrels, message):
  tiny_set(tmp_path)
  (tmp_path / "qrels.tsv").write_text(qrels)
  with pytest.raises(DataError, match=message):
    beir.read(tmp_path)


def test_missing_files_and_bad_json_lines_are_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="no corpus.jsonl, queries.jsonl, qrels.tsv"):
    beir.read(tmp_path)
  tiny_set(tmp_path)
  (tmp_path / "queries.jsonl").write_text('{"_id": "q0", "text": "cat"}\n{"_id": "q1"\n')
  with pytest.raises(DataError, match=r"queries.jsonl:2: not a JSON object"):
    beir.read(tmp_path)


def test_scored_pairs_read_any_column_order_and_name_a_bad_score(tmp_path):
  path = tmp_path / "sts.tsv"
  path.write_text("score\ttext_b\ttext\n4.5\ta cat\tthe cat\n0\ta fox\tthe dog\n")
  pairs = scored_pairs.read(path)
  assert (pairs.texts, pairs.texts_b, pairs.scores) == (["the cat", "the dog"],
                                                        ["a cat", "a fox"], [4.5, 0.0])
  (tmp_path / "sts.csv").write_text("text,text_b,score\na,b,1\nc,d,nan\n")
  with pytest.raises(DataError, match=r"sts.csv:3: score 'nan' is not a finite number"):
    scored_pairs.read(tmp_path / "sts.csv")
  path.write_text("text\ttext_b\na\tb\n")
  with pytest.raises(DataError, match=r"sts.tsv: no column score"):
    scored_pairs.read(path)


# --- evaluators --------------------------------------------------------------------------
def bag_of_words(texts):
  """A deterministic embedding: unit-length word counts over the test vocab."""
  out = np.array([[t.split().count(w) for w in WORDS] for t in texts], np.float32) + 1e-3
  return out / np.linalg.norm(out, axis=1, keepdims=True)


def test_evaluators_rank_the_whole_corpus_and_correlate_pair_scores(tmp_path):
  tiny_set(tmp_path / "set")
  (tmp_path / "sts.csv").write_text("text,text_b,score\nthe cat,the cat,5\nthe cat,a dog,0\n"
                                    "a dog ran,the dog ran,3\n")
  evals = Evaluators.read(tmp_path / "set", tmp_path / "sts.csv", block=2)
  got = evals(bag_of_words)
  found = beir.read(tmp_path / "set")
  want_ids = numpy_top_k(bag_of_words(found.queries), bag_of_words(found.corpus), 3)[1]
  assert got == {**metrics.ranking_metrics(want_ids, found.qrels), "spearman": 1.0}
  assert got["ndcg@10"] == 1.0  # "cat" -> d0 and "dog" -> d1 first


# --- a tiny model ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A Hugging Face BERT directory of a tiny random encoder (mean pooling)."""
  cfg = tiny_config(vocab_size=len(VOCAB), pooling="mean")
  params = nn.meta.unbox(jax.jit(Encoder(cfg).init)(jax.random.key(0),
                                                    np.ones((1, 8), np.int32))["params"])
  path = tmp_path_factory.mktemp("hf") / "bert"
  pretrained.save(path, cfg, params, tiny_tokenizer())
  return path


def test_jaxencoder_eval_prints_the_evaluators_metrics_of_the_loaded_model(hf_dir, tmp_path,
                                                                           capsys):
  tiny_set(tmp_path / "set")
  (tmp_path / "sts.csv").write_text("text,text_b,score\nthe cat,the cat,5\nthe cat,a dog,0\n")
  eval_main(["--model", str(hf_dir), "--retrieval", str(tmp_path / "set"),
             "--sts", str(tmp_path / "sts.csv"), "--json"])
  got = json.loads(capsys.readouterr().out)
  embed = jaxencoder.load(str(hf_dir)).embed
  want = {**retrieval_metrics(embed, beir.read(tmp_path / "set")),
          "spearman": sts_spearman(embed, scored_pairs.read(tmp_path / "sts.csv"))}
  assert got == pytest.approx(want)
  eval_main(["--model", str(hf_dir), "--retrieval", str(tmp_path / "set")])
  table = capsys.readouterr().out.splitlines()
  assert [line.split()[0] for line in table] == ["ndcg@10", "mrr@10", "recall@100"]


@pytest.mark.parametrize("make,message", [
    (lambda p: None, "error: .*set: no corpus.jsonl, queries.jsonl, qrels.tsv"),
    (lambda p: (tiny_set(p), (p / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq7\td0\t1\n")),
     r"error: .*qrels.tsv:2: query-id 'q7' is not in queries.jsonl"),
])
def test_jaxencoder_eval_errors_are_one_line(hf_dir, tmp_path, capsys, make, message):
  (tmp_path / "set").mkdir()
  make(tmp_path / "set")
  with pytest.raises(SystemExit) as exit_:
    eval_main(["--model", str(hf_dir), "--retrieval", str(tmp_path / "set")])
  err = capsys.readouterr().err.strip().splitlines()
  assert exit_.value.code == 2 and len(err) == 1
  assert __import__("re").match(message, err[0]), err


# --- mining ------------------------------------------------------------------------------
def test_hard_negatives_are_the_nearest_candidates_below_the_margin():
  rng = np.random.default_rng(4)
  vectors = {f"t{i}": v / np.linalg.norm(v) for i, v in enumerate(rng.normal(size=(40, 8)))}
  embed = lambda texts: np.stack([vectors[t] for t in texts])
  texts, positives = [f"t{i}" for i in range(10)], [f"t{i + 1}" for i in range(10)]
  candidates = [f"t{i}" for i in range(1, 40)]  # holds t1..t9: texts that are candidates
  got = mining.hard_negatives(embed, texts, positives, candidates, k=3, margin=0.1, block=8)
  for q, row in enumerate(got):
    pos = vectors[positives[q]] @ vectors[texts[q]]
    scores = {c: vectors[c] @ vectors[texts[q]] for c in candidates
              if c not in (texts[q], positives[q]) and vectors[c] @ vectors[texts[q]] <= pos - 0.1}
    want = sorted(scores, key=lambda c: -scores[c])[:3]
    want += [None] * (3 - len(want))
    assert [candidates[i] if i >= 0 else None for i in row] == want


def write_pairs(folder, n=24, seed=5):
  rng = np.random.default_rng(seed)
  words = lambda: " ".join(rng.choice(WORDS, size=4))
  folder.mkdir(parents=True)
  with open(folder / "train.csv", "w", newline="") as f:
    csv.writer(f).writerows([["text", "text_b", "negative"]]
                            + [[words(), words(), words()] for _ in range(n)])
  return folder


def test_mine_writes_k_negatives_that_contrastive_reads_and_refuses_an_existing_name(
    hf_dir, tmp_path, capsys):
  source = builders.prepare("text_records", write_pairs(tmp_path / "pairs"), tmp_path / "tfds",
                            name="pairs")
  args = ["mine", "text_records/pairs", "--data-dir", str(tmp_path), "--model", str(hf_dir),
          "--name", "mined", "--k", "3", "--margin", "0", "--block", "8"]
  data_main(args)
  assert "rows with 3 mined negatives" in capsys.readouterr().out
  rows = list(csv.DictReader(open(tmp_path / "mined" / "mined" / "train.csv")))
  assert rows and json.loads((tmp_path / "mined" / "mined" / "mined.json").read_text())[
      "model"] == str(hf_dir)
  original = {r["text"]: r for r in mining.train_rows(str(source), tmp_path)}
  embed = jaxencoder.load(str(hf_dir)).embed
  for row in rows:
    negatives = [row[f"negative_{j}"] for j in (1, 2, 3)]
    assert row["text_b"] == original[row["text"]]["text_b"]
    assert row["text_b"] not in negatives and row["text"] not in negatives
    q, pos, neg = embed([row["text"]]), embed([row["text_b"]]), embed(negatives)
    scores = (neg @ q.T)[:, 0]
    assert np.all(np.diff(scores) <= 1e-6) and scores[0] <= (pos @ q.T)[0, 0] + 1e-6
  mined = sources.open_source("text_records/mined", "train", tmp_path / "tfds")
  features = contrastive.contrastive_features(tiny_tokenizer(), 8)(mined[0])
  assert features["input_ids"].shape == (5, 8)  # text, text_b, 3 negatives
  with pytest.raises(SystemExit) as exit_:
    data_main(args)
  err = capsys.readouterr().err.strip().splitlines()
  assert exit_.value.code == 2 and len(err) == 1 and "exists" in err[0] and "--name" in err[0]


def test_negative_columns_are_negative_then_negative_n_in_number_order():
  assert records.negative_columns(["text", "negative_10", "negative_2", "negative", "negatives",
                                   "negative_0", "text_b"]) == ["negative", "negative_2",
                                                                "negative_10"]


# --- the Shakespeare halves set ----------------------------------------------------------
def test_shakespeare_retrieval_pairs_each_speechs_first_half_with_its_second(tmp_path):
  speeches = ["To be or not to be that is the question", "Now is the winter of our discontent"]
  (tmp_path / "test.csv").write_text("text\n" + "\n".join(speeches) + "\n")
  shakespeare_tasks.write_retrieval(tmp_path / "test.csv", tmp_path / "set")
  found = beir.read(tmp_path / "set")
  assert found.queries == ["To be or not to", "Now is the"]
  assert found.corpus == ["be that is the question", "winter of our discontent"]
  assert found.qrels == [{0: 1}, {1: 1}]


def test_shakespeare_halves_cut_train_speeches_as_the_retrieval_set_cuts_test_ones():
  class Speech:  # what speech_rows reads of a speech: its lines and split
    def __init__(self, lines, split):
      self.lines, self.split = lines, split
  speeches = [Speech(["To be, or not to be:", "that is the question"], "train"),
              Speech(["Too short"], "train")]
  rows = shakespeare_tasks.halves_rows(speeches, [], None)
  assert rows == [{"text": "To be, or not to", "text_b": "be: that is the question",
                   "_split": "train"}]
  assert shakespeare_tasks.halves("a b c") == ("a", "b c")


# --- per-query metrics and the paired bootstrap ---------------------------------------------
def test_per_query_rows_average_to_the_metrics_and_skip_unjudged_queries():
  ranked_QxK = np.array([[0, 1, 2], [2, 1, 0], [1, 0, 2]])
  qrels = [{1: 1}, {}, {0: 2, 2: 1}]
  rows_Qx3 = metrics.per_query(ranked_QxK, qrels)
  assert rows_Qx3.shape == (2, 3)
  np.testing.assert_allclose(rows_Qx3[0], [1 / math.log2(3), 1 / 2, 1.0])
  ideal = 2 + 1 / math.log2(3)
  np.testing.assert_allclose(rows_Qx3[1], [(2 / math.log2(3) + 1 / math.log2(4)) / ideal,
                                           1 / 2, 1.0])
  assert metrics.ranking_metrics(ranked_QxK, qrels) == pytest.approx(
      dict(zip(metrics.NAMES, rows_Qx3.mean(0))))


def test_paired_bootstrap_matches_a_direct_loop_and_pairs_the_queries():
  rng = np.random.default_rng(3)
  a_Q = rng.random(50)
  b_Q = a_Q + 0.1 + 0.01 * rng.standard_normal(50)
  mean, low, high = metrics.paired_bootstrap(a_Q, b_Q, samples=2000, seed=7)
  picks = np.random.default_rng(7).integers(0, 50, (2000, 50))
  means = [np.mean(b_Q[p] - a_Q[p]) for p in picks]
  assert mean == pytest.approx(np.mean(b_Q - a_Q))
  assert (low, high) == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
  # Paired: a large shared per-query spread does not widen the interval of a steady gain.
  assert 0.09 < low < mean < high < 0.11
  with pytest.raises(ValueError, match="equal-length 1-d"):
    metrics.paired_bootstrap(a_Q, b_Q[:, None])


# --- during training ---------------------------------------------------------------------
def contrastive_config(root, **overrides):
  import train_helpers as th
  source = builders.prepare("text_records", write_pairs(root / "pairs", n=40), root / "tfds",
                            name="pairs")
  config = th.tiny_config(root, str(source), th.write_vocab(root), pooling="mean")
  config.task, config.data.kind, config.projection_dim = "contrastive", "text_records", 0
  config.num_train_steps, config.eval_every, config.checkpoint_every = 4, 2, 2
  config.update(overrides)
  return config


def test_eval_retrieval_on_a_task_without_text_embeddings_is_refused_in_one_line(tmp_path):
  from jaxencoder.train.config import base_config, finalize
  config = base_config()
  config.task, config.eval_retrieval = "classify", str(tmp_path)
  with pytest.raises(ValueError, match=r"eval_retrieval=.* needs an embedding task on text "
                                       r"\(contrastive, mlm\), not task classify"):
    finalize(config)


def test_matryoshka_sizes_named_as_the_retrieval_cutoffs_are_refused(tmp_path):
  from jaxencoder.train.config import base_config, finalize
  config = base_config()
  config.task, config.eval_retrieval, config.projection_dim = "contrastive", str(tmp_path), 0
  config.matryoshka_dims = (128, 100)
  with pytest.raises(ValueError, match="prefix size 100 names metrics as the retrieval"):
    finalize(config)


@pytest.mark.slow
def test_every_eval_row_has_retrieval_and_sts_metrics_as_jaxencoder_eval_gives_them(
    tmp_path, capsys):
  from jaxencoder.train.init_from import finalized
  from jaxencoder.train.loop import train_and_evaluate
  from jaxencoder.train.metrics import read_metrics
  tiny_set(tmp_path / "set")
  (tmp_path / "sts.csv").write_text("text,text_b,score\nthe cat,the cat,5\nthe cat,a dog,0\n"
                                    "a dog ran,the dog ran,3\n")
  config = contrastive_config(tmp_path, eval_retrieval=str(tmp_path / "set"),
                              eval_sts=str(tmp_path / "sts.csv"), best_metric="ndcg@10")
  train_and_evaluate(finalized(config), tmp_path / "run")
  evals = {r["step"]: r for r in read_metrics(tmp_path / "run") if r["split"] == "eval"}
  assert sorted(evals) == [2, 4]
  for step, row in evals.items():
    eval_main(["--model", f"{tmp_path / 'run'}@{step}", "--retrieval", str(tmp_path / "set"),
               "--sts", str(tmp_path / "sts.csv"), "--json"])
    alone = json.loads(capsys.readouterr().out)
    assert {k: row[k] for k in alone} == pytest.approx(alone, abs=1e-6)
