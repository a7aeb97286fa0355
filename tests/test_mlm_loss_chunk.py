"""The MLM loss in chunks (config mlm_loss_chunk): the full-logits loss, metrics and
gradients, without the full [B, M, V] logits in memory."""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import fast_first, random_ids, tiny_config
from jaxencoder.model.heads import EncoderForMaskedLM, VocabProjection, vocab_logits
from jaxencoder.tasks import base, masked_lm, registry
from jaxencoder.train.config import base_config, finalize
from jaxencoder.train.resume import config_changes


def pretraining_batch() -> dict:
  """3 rows of 12 tokens: 10 masked (2 beyond max_predictions 8: dropped), 3 masked of
  weights 1, 0.5, 1 (the other gathered positions weigh 0), none masked; a padded row."""
  ids = random_ids(0, (3, 12), low=5)
  weights = (jnp.zeros((3, 12)).at[0, 1:11].set(1.0)
             .at[1, jnp.array([2, 5, 9])].set(jnp.array([1.0, 0.5, 1.0])))
  return {"input_ids": ids, "attention_mask": jnp.ones_like(ids).at[1, 10:].set(0),
          "token_type_ids": jnp.broadcast_to(jnp.arange(12) >= 6, ids.shape).astype(jnp.int32),
          "mlm_labels": random_ids(2, (3, 12)), "mlm_weights": weights,
          "pair_labels": jnp.array([0, 1, 1]), "example_weights": jnp.array([1.0, 1.0, 0.0])}


def loss_and_grads(task, params, batch):
  loss_fn = lambda p: task.loss_fn(p, batch, jax.random.key(0), False)
  return jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)


# (task, max_predictions, chunk): chunks that do not divide the 8 gathered positions
# (the last chunk padded), ones that do, one longer than a row, every position (M = L).
CASES = fast_first([("mlm", 8, 3), ("mlm_sop", 8, 4), ("mlm", 8, 4), ("mlm_sop", 8, 3),
                    ("mlm", 8, 1), ("mlm", 8, 16), ("mlm_nsp", 8, 4), ("mlm", 0, 5)], fast=2)


@pytest.mark.parametrize("name,max_predictions,chunk", CASES)
def test_chunked_loss_equals_the_full_logits_loss_metrics_and_gradients(
    name, max_predictions, chunk):
  cfg, batch = tiny_config(pooler_dense=True), pretraining_batch()
  full = registry.make_task(name, cfg, max_predictions=max_predictions)
  chunked = registry.make_task(name, cfg, max_predictions=max_predictions,
                               mlm_loss_chunk=chunk)
  params = nn.meta.unbox(full.model.init(jax.random.key(0), *full.example_batch(batch))["params"])
  (loss, sums), grads = loss_and_grads(chunked, params, batch)
  (full_loss, full_sums), full_grads = loss_and_grads(full, params, batch)
  assert abs(float(loss) - float(full_loss)) <= 1e-6
  assert sums.keys() == full_sums.keys()
  for key in sums:
    np.testing.assert_allclose(sums[key], full_sums[key], rtol=1e-6, atol=1e-6, err_msg=key)
  if max_predictions:
    assert float(sums["dropped"]) == 2.0
  metrics, full_metrics = chunked.summarize(sums), full.summarize(full_sums)
  assert metrics == pytest.approx(full_metrics, rel=1e-6, abs=1e-6)
  assert jax.tree.structure(grads) == jax.tree.structure(full_grads)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
               grads, full_grads)


@pytest.mark.parametrize("jit", [False, True])
def test_chunked_weighted_ce_equals_weighted_ce_and_its_gradients(jit):
  """7 positions a row in chunks of 3 (the last padded), weight-0 positions among them."""
  keys = jax.random.split(jax.random.key(0), 5)
  h_BxMxE = jax.random.normal(keys[0], (2, 7, 16))
  table_VxE, bias_V = jax.random.normal(keys[1], (50, 16)), jax.random.normal(keys[2], (50,))
  labels_BxM = jax.random.randint(keys[3], (2, 7), 0, 50)
  weights_BxM = jnp.array([[1.0, 0, 1, 1, 0, 1, 0], [0.5, 1, 0, 0, 1, 1, 1]])
  def full(h, table, bias):
    return base.weighted_ce(vocab_logits(h, table, bias), labels_BxM, weights_BxM)
  def chunked(h, table, bias):
    logits_of = functools.partial(vocab_logits, table_VxE=table, bias_V=bias)
    return base.chunked_weighted_ce(logits_of, h, labels_BxM, weights_BxM, 3)
  compile = jax.jit if jit else (lambda f: f)
  grads = lambda sums_fn: compile(jax.grad(lambda *a: base.mean_loss(sums_fn(*a)),
                                           argnums=(0, 1, 2)))(h_BxMxE, table_VxE, bias_V)
  expected, sums = full(h_BxMxE, table_VxE, bias_V), compile(chunked)(h_BxMxE, table_VxE, bias_V)
  for key in expected:
    np.testing.assert_allclose(sums[key], expected[key], rtol=1e-6, err_msg=key)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6),
               grads(chunked), grads(full))


def test_chunked_loss_compiles_to_a_fraction_of_the_full_logits_memory():
  """4,096 predictions x 32,768 words (one [B*M, V] float32 logits: 512 MiB) in chunks of
  64 per row: the loss and its gradient need a fraction of the full path's temporaries,
  and less than one whole logits array (compiled only, never run)."""
  rows, length, vocab, width, chunk = 8, 512, 32_768, 64, 64
  def loss(chunk, h, table, bias, labels, weights):
    if not chunk:
      return base.mean_loss(base.weighted_ce(vocab_logits(h, table, bias), labels, weights))
    logits_of = functools.partial(vocab_logits, table_VxE=table, bias_V=bias)
    return base.mean_loss(base.chunked_weighted_ce(logits_of, h, labels, weights, chunk))
  shapes = [((rows, length, width), jnp.float32), ((vocab, width), jnp.float32),
            ((vocab,), jnp.float32), ((rows, length), jnp.int32), ((rows, length), jnp.float32)]
  args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
  temp = lambda c: jax.jit(jax.grad(functools.partial(loss, c), argnums=(0, 1, 2))).lower(
      *args).compile().memory_analysis().temp_size_in_bytes
  full, chunked = temp(0), temp(chunk)
  logits_bytes = rows * length * vocab * 4
  assert full >= logits_bytes  # the full path holds the logits (and their gradient)
  assert chunked < logits_bytes / 2
  assert full > 4 * chunked, (full, chunked)


def test_the_head_returns_its_vocab_projection_whose_logits_are_its_logits():
  cfg, ids = tiny_config(), random_ids(0, (2, 7))
  model = EncoderForMaskedLM(cfg)
  variables = nn.meta.unbox(jax.jit(model.init)(jax.random.key(0), ids))
  apply = jax.jit(model.apply, static_argnames="project")
  logits_BxLxV, _ = apply(variables, ids)
  projection, _ = apply(variables, ids, project=False)
  assert isinstance(projection, VocabProjection)
  assert projection.hidden_BxLxE.shape == (2, 7, 32) and projection.bias_V.shape == (97,)
  assert projection.table_VxE.shape == (97, 32)
  np.testing.assert_allclose(projection.logits(), logits_BxLxV, rtol=1e-6, atol=1e-6)


def test_mlm_loss_chunk_reaches_the_task_and_may_change_when_a_run_resumes():
  config = base_config()
  config.mlm_loss_chunk = 64
  config = finalize(config)
  assert masked_lm.FAMILY.task_options("mlm", config)["mlm_loss_chunk"] == 64
  saved = config.to_dict()
  saved["mlm_loss_chunk"] = 0
  assert config_changes(saved, config) == (["mlm_loss_chunk: 0 -> 64"], [])


@pytest.mark.parametrize("task,chunk,error", [
    ("mlm", -1, "mlm_loss_chunk=-1 must be an int >= 0"),
    ("electra", 64, "mlm_loss_chunk=64 is an option of task 'mlm'; task is 'electra'")])
def test_a_bad_or_misplaced_mlm_loss_chunk_is_an_error(task, chunk, error):
  config = base_config()
  config.task, config.mlm_loss_chunk = task, chunk
  with pytest.raises(ValueError, match=error):
    finalize(config)
