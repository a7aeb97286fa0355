"""Matryoshka embeddings: the contrastive loss summed over re-normalised prefixes of the
vectors, checked against InfoNCE in numpy, with metrics at each prefix size."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train_helpers as th
from conftest import random_ids, tiny_config
from jaxencoder.tasks import contrastive, registry
from jaxencoder.tasks.matryoshka import Prefixes, nested_sums
from jaxencoder.train.config import base_config, finalize
from jaxencoder.train.loop import train_and_evaluate

TEMPERATURE = 0.05


def grouped_batch(seed: int, batch: int = 4, k: int = 3, length: int = 6) -> dict:
  ids = random_ids(seed, (batch, k, length))
  return {"input_ids": ids, "attention_mask": jnp.ones_like(ids),
          "example_weights": jnp.ones(batch)}


def task_and_params(batch, **options):
  task = registry.make_task("contrastive", tiny_config(num_layers=1), **options)
  params = jax.jit(task.model.init)(jax.random.key(0), *task.example_batch(batch))["params"]
  return task, nn.meta.unbox(params)


def info_nce_np(q_BxP, c_NxP, dims: int) -> float:
  """Summed one-way InfoNCE of query b against candidate b, on prefixes of `dims`."""
  q, c = (x[:, :dims] / np.linalg.norm(x[:, :dims], axis=-1, keepdims=True)
          for x in (np.asarray(q_BxP, np.float64), np.asarray(c_NxP, np.float64)))
  logits_BxN = q @ c.T / TEMPERATURE
  log_z_B = np.log(np.exp(logits_BxN).sum(-1))
  return float(np.sum(log_z_B - np.diag(logits_BxN[:, :len(q)])))


def test_one_full_size_prefix_of_weight_one_is_the_plain_loss_exactly():
  batch = grouped_batch(0)
  single = {**batch, "input_ids": batch["input_ids"][:, 0],
            "attention_mask": batch["attention_mask"][:, 0]}  # SimCSE's texts alone
  plain, params = task_and_params(batch, projection_dim=16)
  nested, _ = task_and_params(batch, projection_dim=16, prefixes=Prefixes((16,), (1.0,)))
  metrics_only, _ = task_and_params(batch, projection_dim=16,
                                    prefixes=Prefixes((16, 8, 4), (1.0, 0.0, 0.0)))

  @jax.jit  # one compile
  def losses(params):
    return [task.loss_fn(params, b, jax.random.key(1), False)
            for task in (plain, nested, metrics_only) for b in (batch, single)]

  (grouped, _), (simcse, _), (grouped_m, sums), (simcse_m, _), (grouped_0, sums_0), (
      simcse_0, _) = losses(params)
  assert float(grouped_m) == float(grouped) and float(simcse_m) == float(simcse)
  assert not any("@" in key for key in sums)  # the full size keeps the plain names
  # weight 0: the prefix is measured, not trained
  assert float(grouped_0) == float(grouped) and float(simcse_0) == float(simcse)
  assert {"rr_sum@8", "rr_sum@4"} <= set(sums_0)


def test_loss_is_the_weighted_info_nce_of_each_renormalised_prefix():
  batch = grouped_batch(2)
  task, params = task_and_params(batch, projection_dim=16,
                                 prefixes=Prefixes((16, 8), (1.0, 0.5)))

  @jax.jit
  def run(params):
    z = task.model.apply({"params": params}, batch["input_ids"], batch["attention_mask"])
    return z, task.loss_fn(params, batch, jax.random.key(1), False)

  z_BxKxP, (loss, sums) = run(params)
  q, cands = np.asarray(z_BxKxP[:, 0]), np.concatenate([z_BxKxP[:, 1], z_BxKxP[:, 2]])
  full, half = info_nce_np(q, cands, 16), info_nce_np(q, cands, 8)
  np.testing.assert_allclose(sums["loss_sum"], full + 0.5 * half, rtol=1e-5)
  np.testing.assert_allclose(loss, (full + 0.5 * half) / 4, rtol=1e-5)
  np.testing.assert_allclose(sums["loss_sum@8"], half, rtol=1e-5)


def test_without_a_projection_the_vectors_are_the_normalised_pooled_output():
  batch = grouped_batch(3)
  task, params = task_and_params(batch, projection_dim=0, prefixes=Prefixes((32, 16)))
  assert "head" not in params
  z_BxKxP = task.model.apply({"params": params}, batch["input_ids"], batch["attention_mask"])
  assert z_BxKxP.shape == (4, 3, 32)
  np.testing.assert_allclose(jnp.linalg.norm(z_BxKxP, axis=-1), 1.0, rtol=1e-5)


def test_each_prefix_is_summarized_under_its_size():
  q_BxP, c_NxP = jax.random.normal(jax.random.key(4), (2, 6, 8))
  unit = lambda x: x / jnp.linalg.norm(x, axis=-1, keepdims=True)
  sums_fn = lambda q, c: contrastive.retrieval_sums(q, c, jnp.ones(6), jnp.ones(6), TEMPERATURE)
  sums = nested_sums(sums_fn, Prefixes((8, 4, 2)), unit(q_BxP), unit(c_NxP))
  metrics = contrastive.FAMILY.summarize("contrastive", sums)
  for dims in (4, 2):
    alone = contrastive.FAMILY.summarize(
        "contrastive", sums_fn(unit(q_BxP[:, :dims]), unit(c_NxP[:, :dims])))
    for name in ("loss", "accuracy", "mrr", "recall_at_1", "recall_at_5"):
      assert metrics[f"{name}@{dims}"] == pytest.approx(alone[name], rel=1e-5)
  full = contrastive.FAMILY.summarize("contrastive", sums_fn(unit(q_BxP), unit(c_NxP)))
  assert metrics["mrr"] == pytest.approx(full["mrr"])
  assert "mrr@8" not in metrics
  assert [m for m in metrics if m.startswith("mrr")] == ["mrr", "mrr@4", "mrr@2"]
  modes = {m: contrastive.FAMILY.metric_mode(m) for m in ("mrr@4", "loss@4", "recall_at_1@2")}
  assert modes == {"mrr@4": "max", "loss@4": "min", "recall_at_1@2": "max"}


@pytest.mark.parametrize("dims, weights, match", [
    ((16, 32), (), "each must be an int in 1..16"),
    ((0,), (), "each must be an int in 1..16"),
    ((8, 16), (), "must be strictly decreasing"),
    ((16, 8, 8), (), "must be strictly decreasing"),
    ((16, 8), (1.0,), "one weight >= 0 per dim"),
    ((16, 8), (1.0, -1.0), "one weight >= 0 per dim"),
    ((16, 8), (0.0, 0.0), "some > 0"),
])
def test_bad_prefixes_are_refused_with_the_rule(dims, weights, match):
  with pytest.raises(ValueError, match=match):
    Prefixes(dims, weights).check(16)


def test_a_config_with_prefixes_wider_than_the_embedding_is_refused_at_finalize():
  config = base_config()
  config.task, config.model.emb_dim, config.projection_dim = "contrastive", 32, 0
  config.matryoshka_dims = [64, 32]  # a list becomes a tuple
  with pytest.raises(ValueError, match=r"matryoshka_dims=\(64, 32\): each must be an int in 1..32"):
    finalize(config)
  config.projection_dim = 128  # the prefixes are of the projection's vectors
  assert finalize(config).matryoshka_dims == (64, 32)


@pytest.mark.slow
def test_a_run_reports_retrieval_at_each_prefix(tmp_path):
  config = th.tiny_config(tmp_path, th.text_corpus(tmp_path), th.write_vocab(tmp_path),
                          num_layers=1)
  config.task, config.projection_dim, config.matryoshka_dims = "contrastive", 0, (32, 8)
  config.data.views, config.num_train_steps = "halves", 3
  metrics = train_and_evaluate(config, tmp_path / "run")
  assert {"loss", "mrr", "recall_at_1", "loss@8", "mrr@8", "recall_at_1@8"} <= set(metrics)
  assert 0.0 < metrics["mrr@8"] <= 1.0


def test_the_keys_belong_to_the_contrastive_task():
  """Set for another task they are an error; a stored run's empty lists are not."""
  config = base_config()
  config.task, config.matryoshka_dims = "classify", (64, 32)
  with pytest.raises(ValueError, match=r"matryoshka_dims=\(64, 32\) is an option of task "
                                       "'contrastive'; task is 'classify'"):
    finalize(config)
  stored = base_config().to_dict() | {"matryoshka_dims": [], "matryoshka_weights": []}
  assert registry.resolve(stored) == "mlm"
