"""The contrastive family's other losses against direct numpy formulas: symmetric InfoNCE
(query -> document and document -> query, averaged) and CoSENT on scored pairs (task
contrastive_cosent: its option, data, metrics and a run trained with GradCache)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import train_helpers as th
from conftest import tiny_config
from jaxencoder.data import builders
from jaxencoder.tasks import contrastive, registry
from jaxencoder.train.config import apply_overrides, resolved_task
from jaxencoder.train.config_file import load_config
from jaxencoder.train.loop import train_and_evaluate
from jaxencoder.train.metrics import read_metrics
from test_configs import REPO, TINY
from test_heads_tasks import write_csv

T = 0.05


def unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def logsumexp(x):
  return np.max(x) + np.log(np.sum(np.exp(x - np.max(x))))


def test_symmetric_info_nce_averages_both_directions():
  rng = np.random.default_rng(0)
  q, pos, neg = unit(rng.standard_normal((3, 5, 8)))
  w = np.array([1.0, 1, 0, 1, 1])  # row 2: padding, neither a query nor a candidate
  cands = np.concatenate([pos, neg])
  sums = contrastive.retrieval_sums(jnp.asarray(q), jnp.asarray(cands), jnp.asarray(w),
                                    jnp.asarray(np.tile(w, 2)), T, symmetric=True)
  sim = q @ cands.T / T
  real = np.flatnonzero(w)
  forward = [logsumexp(sim[i, np.r_[real, real + 5]]) - sim[i, i] for i in real]
  backward = [logsumexp(sim[real, i]) - sim[i, i] for i in real]  # positive i -> queries
  np.testing.assert_allclose(float(sums["loss_sum"]),
                             sum((f + b) / 2 for f, b in zip(forward, backward)), rtol=1e-5)
  one_way = contrastive.retrieval_sums(jnp.asarray(q), jnp.asarray(cands), jnp.asarray(w),
                                       jnp.asarray(np.tile(w, 2)), T)
  np.testing.assert_allclose(float(one_way["loss_sum"]), sum(forward), rtol=1e-5)
  for key in ("correct", "rr_sum", "hits_at_5"):  # ranks stay query -> document
    assert float(sums[key]) == float(one_way[key])


def cosent_reference(cos, scores, scale=20.0):
  """log(1 + sum_{s_i > s_j} exp(scale (cos_j - cos_i))), written out."""
  total = sum(np.exp(scale * (cos[j] - cos[i])) for i in range(len(cos))
              for j in range(len(cos)) if scores[i] > scores[j])
  return np.log1p(total)


def test_cosent_is_the_direct_formula_over_ordered_pairs():
  rng = np.random.default_rng(1)
  a, b = rng.standard_normal((2, 6, 8))
  scores = np.array([0.5, 3.0, 3.0, 1.0, 4.5, 2.0])  # a tie orders no pair
  w = np.array([1.0, 1, 1, 1, 1, 0])  # the last row is padding
  sums = contrastive.cosent_sums(jnp.asarray(a), jnp.asarray(b), jnp.asarray(scores),
                                 jnp.asarray(w), 20.0)
  cos = np.sum(unit(a) * unit(b), -1)
  want = cosent_reference(cos[:5], scores[:5])
  np.testing.assert_allclose(float(sums["loss_sum"]) / float(sums["loss_weight"]), want,
                             rtol=1e-5)
  assert float(sums["loss_weight"]) == 5.0


def test_cosent_is_log_2_when_all_cosines_agree_and_less_when_they_rank_the_scores():
  scores = jnp.array([1.0, 2.0])
  same = jnp.ones((2, 4))
  sums = contrastive.cosent_sums(same, same, scores, jnp.ones(2), 20.0)
  np.testing.assert_allclose(float(sums["loss_sum"]) / 2, np.log(2), rtol=1e-6)
  a = jnp.array([[1.0, 0.0], [1.0, 0.0]])
  b = jnp.array([[0.0, 1.0], [1.0, 0.0]])  # cos 0 for score 1, cos 1 for score 2
  ranked = contrastive.cosent_sums(a, b, scores, jnp.ones(2), 2.0)
  np.testing.assert_allclose(float(ranked["loss_sum"]) / 2, np.log1p(np.exp(-2.0)), rtol=1e-5)


def test_cosent_eval_ranks_cosines_against_scores_for_spearman():
  task = registry.make_task("contrastive_cosent", tiny_config(num_layers=1), projection_dim=8)
  rng = np.random.default_rng(2)
  z = jnp.asarray(unit(rng.standard_normal((6, 2, 8))))
  scores = jnp.asarray(rng.random(6) * 5)
  batch = {"targets": scores, "example_weights": jnp.ones(6), "example_index": jnp.arange(6)}
  _, sums = task.embedding_loss_fn(z, batch)
  metrics = task.summarize(jax.device_get(sums))
  cos = np.sum(np.asarray(z[:, 0]) * np.asarray(z[:, 1]), -1)
  assert metrics["spearman"] == pytest.approx(scipy.stats.spearmanr(cos, scores)[0], abs=1e-6)
  assert "accuracy" not in metrics


def config_with(*overrides):
  config = load_config(str(REPO / "configs" / "contrastive_pairs.py"))
  apply_overrides(config, list(overrides))
  return config


def test_contrastive_loss_cosent_resolves_to_its_task_and_a_bad_name_is_refused():
  assert resolved_task(config_with("contrastive_loss=cosent")) == "contrastive_cosent"
  assert resolved_task(config_with()) == "contrastive"
  with pytest.raises(ValueError, match="contrastive_loss='hinge' is not one of"):
    resolved_task(config_with("contrastive_loss=hinge"))
  with pytest.raises(ValueError, match="symmetric=True is an option of task 'contrastive'"):
    resolved_task(config_with("task=regression", "symmetric=true"))


@pytest.mark.slow
def test_a_cosent_run_with_grad_accumulation_trains_and_reports_spearman(tmp_path):
  rng = np.random.default_rng(5)
  words = lambda n: " ".join(rng.choice(th.WORDS, size=n))
  for split, n in (("train", 32), ("test", 12)):
    write_csv(tmp_path / "sts" / f"{split}.csv", ["text", "text_b", "score"],
              [[words(4), words(4), f"{rng.random() * 5:.2f}"] for _ in range(n)])
  source = builders.prepare("text_records", tmp_path / "sts", tmp_path / "tfds", name="sts")
  config = config_with(*TINY, "contrastive_loss=cosent", "optim.grad_accum_steps=2",
                       "num_train_steps=2", f"data.source={source}",
                       f"data.data_dir={tmp_path}", f"model.vocab_size={len(th.VOCAB)}",
                       f"data.tokenizer={th.write_vocab(tmp_path)}", "data.seq_len=16",
                       "best_metric=spearman")
  metrics = train_and_evaluate(config, tmp_path / "run")
  assert np.isfinite(metrics["loss"])
  evals = [r for r in read_metrics(tmp_path / "run") if r["split"] == "eval"]
  assert evals and all(-1 <= r["spearman"] <= 1 for r in evals)
