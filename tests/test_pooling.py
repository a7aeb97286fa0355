"""Pooling [B, L, D] -> [B, D]: each kind against its formula, and padding that never
changes the pooled vector nor the real positions, for every front end x pooling."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_ids, tiny_config
from jaxencoder import Encoder
from jaxencoder.model.pooling import AttentionPool, Pooler, max_pool, mean_pool


def test_pooling_functions_ignore_padding():
  x = jnp.array([[[1.0, -2.0], [3.0, 4.0], [100.0, 100.0]]])
  mask = jnp.array([[1, 1, 0]])
  np.testing.assert_allclose(mean_pool(x, mask), [[2.0, 1.0]])
  np.testing.assert_allclose(max_pool(x, mask), [[3.0, 4.0]])
  negative = -jnp.ones((1, 3, 2)) * jnp.array([[[5.0], [7.0], [1.0]]])
  np.testing.assert_allclose(max_pool(negative, mask), [[-5.0, -5.0]])  # the pad's -1 is no max


def test_attention_pool_is_a_softmax_over_real_tokens_of_key_dot_query():
  cfg = tiny_config(emb_dim=4, num_heads=1)
  rng = np.random.default_rng(0)
  x = rng.normal(size=(2, 5, 4)).astype(np.float32)
  mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
  params = {"query": rng.normal(size=(4,)).astype(np.float32),
            "key": {"kernel": rng.normal(size=(4, 4)).astype(np.float32),
                    "bias": rng.normal(size=(4,)).astype(np.float32)}}
  got = AttentionPool(cfg).apply({"params": params}, jnp.asarray(x), jnp.asarray(mask))
  logits = (x @ params["key"]["kernel"] + params["key"]["bias"]) @ params["query"] / 2.0
  logits = np.where(mask == 1, logits, -np.inf)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  np.testing.assert_allclose(got, np.einsum("bl,bld->bd", weights, x), rtol=1e-5, atol=1e-6)


def test_bert_pooler_is_tanh_of_a_dense_layer_on_cls():
  cfg = tiny_config(emb_dim=4, num_heads=1, pooling="cls", pooler_dense=True)
  rng = np.random.default_rng(1)
  x = rng.normal(size=(2, 3, 4)).astype(np.float32)
  dense = {"kernel": rng.normal(size=(4, 4)).astype(np.float32),
           "bias": rng.normal(size=(4,)).astype(np.float32)}
  got = Pooler(cfg).apply({"params": {"dense": dense}}, jnp.asarray(x), jnp.ones((2, 3)))
  np.testing.assert_allclose(got, np.tanh(x[:, 0] @ dense["kernel"] + dense["bias"]),
                             rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ padding invariance
POOLINGS = ["cls", "mean", "max", "attention"]
REAL, PADDED = 7, 12


def assert_same(a, b):
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def eager_model(cfg, example):
  """(variables, apply), eager: 18 configs x 2 shapes compile nothing new after the first."""
  model = Encoder(cfg)
  return model.init(jax.random.key(0), example), model.apply


@pytest.mark.parametrize("pooling", POOLINGS)
def test_text_padding_changes_neither_pooled_nor_real_tokens(pooling):
  cfg = tiny_config(pooling=pooling, pooler_dense=pooling == "cls")
  ids = random_ids(1, (2, REAL))
  garbage = random_ids(2, (2, PADDED - REAL))
  mask = jnp.concatenate([jnp.ones((2, REAL), jnp.int32),
                          jnp.zeros((2, PADDED - REAL), jnp.int32)], axis=1)
  variables, apply = eager_model(cfg, ids)
  short = apply(variables, ids)
  long = apply(variables, jnp.concatenate([ids, garbage], axis=1), attention_mask=mask)
  assert_same(long.last_hidden_state[:, :REAL], short.last_hidden_state)
  assert_same(long.pooled, short.pooled)


@pytest.mark.parametrize("use_cls_token, pooling", [
    (True, "cls"), (True, "mean"), (True, "max"), (True, "attention"),
    (False, "mean"), (False, "max"), (False, "attention")])
def test_series_padding_changes_neither_pooled_nor_real_steps(use_cls_token, pooling):
  """Series gain a prepended [CLS] (when configured) that the mask must count as real."""
  cfg = tiny_config(input_kind="series", input_features=3, use_cls_token=use_cls_token,
                    pooling=pooling)
  series = jax.random.normal(jax.random.key(3), (2, REAL, 3))
  garbage = 100.0 * jax.random.normal(jax.random.key(4), (2, PADDED - REAL, 3))
  mask = jnp.concatenate([jnp.ones((2, REAL), jnp.int32),
                          jnp.zeros((2, PADDED - REAL), jnp.int32)], axis=1)
  variables, apply = eager_model(cfg, series)
  short = apply(variables, series)
  long = apply(variables, jnp.concatenate([series, garbage], axis=1), attention_mask=mask)
  real = REAL + int(use_cls_token)
  assert long.last_hidden_state.shape[1] == PADDED + int(use_cls_token)
  assert_same(long.last_hidden_state[:, :real], short.last_hidden_state)
  assert_same(long.pooled, short.pooled)


@pytest.mark.parametrize("use_cls_token, pooling", [
    (True, "cls"), (True, "mean"), (True, "max"), (True, "attention"),
    (False, "mean"), (False, "max"), (False, "attention")])
def test_masked_image_patches_change_neither_pooled_nor_real_patches(use_cls_token, pooling):
  """Images have a fixed grid: patches masked out (the last row of 4) may hold anything."""
  cfg = tiny_config(input_kind="image", image_size=(16, 16), patch_size=4, num_channels=1,
                    use_cls_token=use_cls_token, pooling=pooling)
  images = jax.random.normal(jax.random.key(5), (2, 16, 16, 1))
  other = images.at[:, 12:].set(100.0)  # only the masked last patch row differs
  mask = jnp.concatenate([jnp.ones((2, 12), jnp.int32), jnp.zeros((2, 4), jnp.int32)], axis=1)
  variables, apply = eager_model(cfg, images)
  a = apply(variables, images, attention_mask=mask)
  b = apply(variables, other, attention_mask=mask)
  real = 12 + int(use_cls_token)
  assert float(jnp.abs(a.last_hidden_state[:, real:] - b.last_hidden_state[:, real:]).max()) > 0
  assert_same(b.last_hidden_state[:, :real], a.last_hidden_state[:, :real])
  assert_same(b.pooled, a.pooled)
