"""Span, multi-label, regression, multiple-choice and supervised-contrastive tasks: each
loss and metric against a reference on hand-made inputs, their data, and each config
trained for 2 steps on data made here."""

import csv
import itertools
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.stats

from conftest import random_ids, tiny_config
from data_helpers import WORDS, tiny_tokenizer
from jaxencoder import rank_correlation
from jaxencoder.data import builders, records, shakespeare_tasks, sources
from jaxencoder.data.readers import DataError
from jaxencoder.model.heads import info_nce_loss
from jaxencoder.tasks import classification, contrastive, registry, regression, span



# --- span --------------------------------------------------------------------------------
def brute_force_span(start, end, mask, max_len):
  best, arg = -np.inf, (0, 0)
  for i, j in itertools.product(range(len(start)), repeat=2):
    if mask[i] and mask[j] and i <= j < i + max_len and start[i] + end[j] > best:
      best, arg = start[i] + end[j], (i, j)
  return arg


@pytest.mark.parametrize("max_len", [1, 3, 20])
def test_best_span_is_the_brute_force_argmax_under_the_length_limit(max_len):
  rng = np.random.default_rng(max_len)
  start, end = rng.normal(size=(2, 6, 11)).astype(np.float32)
  mask = rng.random((6, 11)) < 0.7
  mask[:, 4] = True  # every row has a place for an answer
  got_start, got_end = jax.jit(span.best_span, static_argnums=3)(start, end, mask,
                                                                       max_len)
  for b in range(6):
    assert (int(got_start[b]), int(got_end[b])) == brute_force_span(start[b], end[b], mask[b],
                                                                    max_len)


def test_span_sums_count_exact_matches_and_overlap_f1():
  # gold spans (2, 4) and (1, 1); logits make the best spans (2, 4) and (1, 3)
  start = jnp.full((2, 6), -5.0).at[0, 2].set(5).at[1, 1].set(5)
  end = jnp.full((2, 6), -5.0).at[0, 4].set(5).at[1, 3].set(5)
  batch = {"context_mask": jnp.ones((2, 6), jnp.int32).at[:, 0].set(0),
           "example_weights": jnp.ones(2), "start_positions": jnp.array([2, 1]),
           "end_positions": jnp.array([4, 1])}
  sums = span.span_sums(start, end, batch, max_len=30)
  assert float(sums["correct"]) == 1.0
  np.testing.assert_allclose(sums["span_f1"], 1.0 + 2 * 1 / (3 + 1), rtol=1e-6)
  masked = jnp.where(batch["context_mask"] > 0, start, -1e9)
  ce = (optax.softmax_cross_entropy_with_integer_labels(masked, batch["start_positions"])
        + optax.softmax_cross_entropy_with_integer_labels(
            jnp.where(batch["context_mask"] > 0, end, -1e9), batch["end_positions"])) / 2
  np.testing.assert_allclose(sums["loss_sum"], ce.sum(), rtol=1e-6)


def test_span_features_point_at_the_answer_tokens_of_the_context():
  tok = tiny_tokenizer()
  ex = {"question": b"the fox", "context": b"a quick brown fox jumps over the dog",
        "answer": b"brown fox", "answer_start": 8, "origin": b"t:1"}
  out = span.span_features(tok, 16)(ex)
  first, last = int(out["start_positions"]), int(out["end_positions"])
  assert tok.decode(out["input_ids"][first:last + 1]) == "brown fox"
  in_context = np.flatnonzero(out["context_mask"])
  assert list(tok.decode(out["input_ids"][in_context]).split()) == ex["context"].decode().split()
  assert out["example_weights"] == 1.0


def test_span_cut_off_by_truncation_has_weight_zero_and_a_wrong_answer_names_its_row():
  tok = tiny_tokenizer()
  ex = {"context": b"the cat sat on a mat the dog ran far away", "answer": b"away",
        "origin": b"t:2"}
  assert span.span_features(tok, 6)(ex)["example_weights"] == 0.0
  with pytest.raises(DataError, match="t:2: answer 'fox' is not in the context"):
    span.span_features(tok, 16)({**ex, "answer": b"fox"})


# --- multi-label -------------------------------------------------------------------------
def test_multilabel_f1_micro_and_macro_on_a_hand_built_case():
  gold = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 0]], np.float32)
  pred = np.array([[1, 0, 0], [0, 1, 1], [1, 0, 0], [0, 0, 0]], np.float32)
  sums = classification.multilabel_sums(jnp.asarray(pred * 4 - 2), jnp.asarray(gold), jnp.ones(4))
  # label 0: tp 2; label 1: tp 1, fn 1; label 2: fp 1, fn 1
  np.testing.assert_array_equal(sums["label_tp"], [2, 1, 0])
  np.testing.assert_array_equal(sums["label_fp"], [0, 0, 1])
  np.testing.assert_array_equal(sums["label_fn"], [0, 1, 1])
  metrics = classification.FAMILY.summarize("multilabel", sums)
  assert metrics["f1_micro"] == pytest.approx(2 * 3 / (2 * 3 + 1 + 2))
  assert metrics["f1_macro"] == pytest.approx((1.0 + 2 / 3 + 0.0) / 3)
  assert metrics["accuracy"] == pytest.approx(1 / 4)  # only the empty row entirely right


def test_max_pooling_gives_a_fill_row_zeros_not_an_overflow():
  from jaxencoder.model.pooling import max_pool
  x_BxLxD = jnp.arange(12.0).reshape(2, 3, 2)
  pooled = max_pool(x_BxLxD, jnp.array([[1, 1, 0], [0, 0, 0]]))
  np.testing.assert_array_equal(pooled, [[2.0, 3.0], [0.0, 0.0]])


def test_multilabel_loss_is_the_mean_binary_cross_entropy():
  logits = jax.random.normal(jax.random.key(0), (5, 4)) * 2
  labels = (jax.random.uniform(jax.random.key(1), (5, 4)) < 0.4).astype(jnp.float32)
  weights = jnp.array([1.0, 1.0, 0.0, 1.0, 1.0])
  sums = classification.multilabel_sums(logits, labels, weights)
  p = 1 / (1 + np.exp(-np.asarray(logits, np.float64)))
  bce = -(labels * np.log(p) + (1 - labels) * np.log(1 - p)).mean(-1)
  np.testing.assert_allclose(sums["loss_sum"], (bce * weights).sum(), rtol=1e-5)
  assert float(sums["loss_weight"]) == 4.0


# --- regression --------------------------------------------------------------------------
def test_mse_and_pearson_from_sums_over_batches_match_numpy():
  rng = np.random.default_rng(0)
  target = rng.normal(size=40).astype(np.float32)
  pred = (0.6 * target + rng.normal(size=40) * 0.5).astype(np.float32)
  totals = None
  for part in np.array_split(np.arange(40), 3):
    sums = regression.regression_sums(pred[part], target[part], np.ones(len(part)))
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  metrics = regression.FAMILY.summarize("regression", jax.device_get(totals))
  assert metrics["loss"] == pytest.approx(np.mean((pred - target) ** 2), rel=1e-5)
  assert metrics["pearson"] == pytest.approx(np.corrcoef(pred, target)[0, 1], rel=1e-4)
  assert "accuracy" not in metrics


def test_spearman_matches_scipy_with_ties():
  rng = np.random.default_rng(1)
  x = rng.integers(0, 6, 50).astype(float)  # many ties
  y = x + rng.normal(size=50)
  assert regression.spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y)[0], rel=1e-9)
  np.testing.assert_allclose(rank_correlation.rank_average(x), scipy.stats.rankdata(x))


def test_ranked_sums_over_shuffled_batches_give_the_split_in_order():
  rng = np.random.default_rng(2)
  pred, target = rng.normal(size=(2, 10)).astype(np.float32)
  order = rng.permutation(10)
  totals = None
  for part in np.array_split(order, 3):  # a fill row (weight 0) in each batch
    idx, w = np.r_[part, 0], np.r_[np.ones(len(part)), 0.0]
    sums = regression.ranked_sums(jnp.asarray(np.r_[pred[part], 9.0]),
                                  jnp.asarray(np.r_[target[part], 9.0]), jnp.asarray(w),
                                  jnp.asarray(idx), capacity=16)
    totals = sums if totals is None else jax.tree.map(jnp.add, totals, sums)
  np.testing.assert_allclose(totals["ranked_pred"][:10], pred)
  np.testing.assert_array_equal(totals["ranked_count"], np.r_[np.ones(10), np.zeros(6)])
  expected = scipy.stats.spearmanr(pred, target)[0]
  assert regression.FAMILY.summarize("regression", {**regression.regression_sums(
      jnp.asarray(pred), jnp.asarray(target), jnp.ones(10)), **totals})["spearman"] == pytest.approx(
      expected, rel=1e-6)


# --- retrieval ---------------------------------------------------------------------------
def test_recall_at_k_and_mrr_on_a_hand_made_similarity_matrix():
  # queries are unit vectors; candidates chosen so that the positives rank 1, 4, 2
  q = jnp.eye(3, 4)
  cands = jnp.array([[0.9, 0.0, 0.0, 0.1],   # positive of q0: rank 1 for q0
                     [0.5, 0.2, 0.0, 0.0],   # positive of q1 (0.2): below 0.7, 0.5, 0.9
                     [0.0, 0.7, 0.3, 0.0],   # positive of q2 (0.3): below 0.8
                     [0.0, 0.5, 0.8, 0.0],   # hard negatives
                     [0.0, 0.9, 0.0, 0.0],
                     [0.0, 0.0, 0.0, 0.0]])  # weight 0: never counted
  w = jnp.ones(3)
  sums = contrastive.retrieval_sums(q, cands, w, jnp.array([1.0, 1, 1, 1, 1, 0]), 0.1,
                                   ks=(1, 2))
  metrics = contrastive.FAMILY.summarize("contrastive", sums)
  assert metrics["recall_at_1"] == pytest.approx(1 / 3)
  assert metrics["recall_at_2"] == pytest.approx(2 / 3)
  assert metrics["mrr"] == pytest.approx((1 + 1 / 4 + 1 / 2) / 3)
  sim = np.asarray(q @ cands[:5].T) / 0.1
  ce = [np.log(np.exp(s).sum()) - s[i] for i, s in enumerate(sim)]
  assert float(sums["loss_sum"]) == pytest.approx(sum(ce), rel=1e-5)


def test_retrieval_loss_without_negatives_is_one_directional_info_nce():
  a, b = jax.random.normal(jax.random.key(3), (2, 5, 8))
  a, b = (x / jnp.linalg.norm(x, axis=-1, keepdims=True) for x in (a, b))
  sums = contrastive.retrieval_sums(a, b, jnp.ones(5), jnp.ones(5), 0.05)
  np.testing.assert_allclose(sums["loss_sum"] / 5, info_nce_loss(a, b, 0.05, symmetric=False),
                             rtol=1e-5)


# --- models ------------------------------------------------------------------------------
def _init(task, batch):
  params = jax.jit(task.model.init)(jax.random.key(0), *task.example_batch(batch))["params"]
  return nn.meta.unbox(params)


@pytest.mark.slow
def test_multiple_choice_scores_each_choice_on_its_own():
  task = registry.make_task("multiple_choice", tiny_config(num_layers=1))
  ids = random_ids(0, (2, 3, 7))
  batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids),
           "labels": jnp.array([0, 2]), "example_weights": jnp.ones(2)}

  @jax.jit  # one compile
  def run(params):
    apply = lambda ids: task.model.apply({"params": params}, ids, jnp.ones_like(ids))
    return apply(ids), apply(ids[:, ::-1]), task.loss_fn(params, batch, jax.random.key(0), False)

  logits, swapped, (loss, sums) = run(_init(task, batch))
  assert logits.shape == (2, 3)
  np.testing.assert_allclose(swapped, logits[:, ::-1], rtol=1e-5, atol=1e-6)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]).mean()
  np.testing.assert_allclose(loss, ce, rtol=1e-5)


@pytest.mark.slow
def test_supervised_pairs_embed_each_text_as_alone():
  task = registry.make_task("contrastive", tiny_config(num_layers=1), projection_dim=16)
  ids = random_ids(1, (4, 3, 6))
  batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids),
           "example_weights": jnp.ones(4)}

  @jax.jit  # one compile
  def run(params):
    apply = lambda ids: task.model.apply({"params": params}, ids, jnp.ones_like(ids))
    return apply(ids), apply(ids[:, 2]), task.loss_fn(params, batch, jax.random.key(0), False)

  z, alone, (_, sums) = run(_init(task, batch))
  assert z.shape == (4, 3, 16)
  np.testing.assert_allclose(z[:, 2], alone, rtol=1e-5, atol=1e-6)
  ref = contrastive.retrieval_sums(z[:, 0], jnp.concatenate([z[:, 1], z[:, 2]]), jnp.ones(4),
                                  jnp.ones(8), 0.05)
  for key in ("loss_sum", "correct", "rr_sum"):
    np.testing.assert_allclose(sums[key], ref[key], rtol=1e-5)


# --- data --------------------------------------------------------------------------------
def write_csv(path: pathlib.Path, header: list[str], rows: list[list]) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "w", newline="") as f:
    csv.writer(f).writerows([header] + rows)


def test_text_records_type_their_columns_by_name(tmp_path):
  write_csv(tmp_path / "src/train.csv", ["text", "labels", "target", "label"],
            [["the cat", "b|a", "0.5", "2"], ["a dog", "", "-1", "0"]])
  out = builders.prepare("text_records", tmp_path / "src", tmp_path / "tfds", name="r")
  src = sources.open_source(str(out), "train")
  rows = sorted((src[i] for i in range(2)), key=lambda r: r["target"])
  assert sources.label_names(str(out), feature="labels") == ["a", "b"]
  assert list(rows[1]["labels"]) == [1, 0] and list(rows[0]["labels"]) == []
  assert rows[1]["target"] == pytest.approx(0.5) and rows[1]["label"] == 2
  assert rows[1]["text"] == b"the cat"


def test_text_records_errors_name_the_row(tmp_path):
  write_csv(tmp_path / "src/train.csv", ["text", "target"], [["a", "1"], ["b", "high"]])
  with pytest.raises(DataError, match=r"train.csv:3: column 'target' = 'high' is not a finite "
                                       "number"):
    builders.prepare("text_records", tmp_path / "src", tmp_path / "tfds", name="bad")
  fn = records.checked(regression.regression_features(tiny_tokenizer(), 8),
                       regression.FAMILY.record_columns["regression"], "regression")
  with pytest.raises(DataError, match="o: task regression needs columns text, target; "
                     "missing target"):
    fn({"text": b"a", "origin": b"o"})


PLAY = """THE TOY PLAY

by Nobody

PERSONS REPRESENTED.

Horatio, a friend.
Ghost of a father.

ACT I.

Hor.
Where is the ghost? Speak, Marcellus!
My good lord, the ghost was here;
Now it is gone away.

Ghost.
Remember me, Horatio, the ghost of thy father.
[Exit.]

Hor.
Good night, sweet prince, and flights of angels sing;
Horatio will remember thee.
"""


def test_shakespeare_tasks_keep_speeches_names_and_answers(tmp_path):
  (tmp_path / "hamlet_gut.txt").write_text(PLAY * 3, encoding="latin-1")
  speeches, names = shakespeare_tasks.read_play(tmp_path / "hamlet_gut.txt")
  assert names == ["Horatio"]  # "Ghost" is also a common noun here
  assert speeches[1].lines == ("Remember me, Horatio, the ghost of thy father.",)
  rng = np.random.default_rng(0)
  for row in shakespeare_tasks.span_rows(speeches, names, rng):
    start = row["answer_start"]
    assert row["context"][start:start + len(row["answer"])] == "Horatio"
  for row in shakespeare_tasks.choice_rows(speeches, names, rng):
    speech = next(s for s in speeches if row["text"] in s.lines)
    assert row[f"choice_{row['label']}"] == speech.lines[speech.lines.index(row["text"]) + 1]
  labels = {r["labels"] for r in shakespeare_tasks.multilabel_rows(speeches, names, rng)}
  assert {"family", "royalty|night"} <= labels  # "father"; "prince", "night" (THEMES order)


# --- each config, 2 steps ----------------------------------------------------------------
def task_source(root: pathlib.Path, task: str) -> str:
  """A tiny prepared text_records set for `task` over the test vocab; its dir."""
  rng = np.random.default_rng(5)
  words = lambda n: " ".join(rng.choice(WORDS, size=n))
  make = {
      "span": (["context", "answer"], lambda: (lambda a: [f"{words(3)} {a} {words(2)}", a])(
          str(rng.choice(WORDS)))),
      "multilabel": (["text", "labels"], lambda: (lambda t: [t, "|".join(
          sorted({w for w in t.split() if w in ("cat", "dog", "fox")}))])(words(6))),
      "regression": (["text", "target"], lambda: (lambda t: [t, str(t.count("cat"))])(words(6))),
      "multiple_choice": (["text", "choice_0", "choice_1", "choice_2", "label"],
                          lambda: [words(4), words(3), words(3), words(3), str(rng.integers(3))]),
      "contrastive": (["text", "text_b", "negative"], lambda: [words(4), words(4), words(4)]),
  }[task]
  for split, n in (("train", 24), ("test", 10)):
    write_csv(root / task / f"{split}.csv", make[0], [make[1]() for _ in range(n)])
  return str(builders.prepare("text_records", root / task, root / "tfds", name=task))


# Each of these tasks' configs runs from train.py in tests/test_configs.py (which also
# checks what jaxencoder-predict makes of the run).
