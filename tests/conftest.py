"""Shared test settings: float32 matmuls at full precision, rank promotion raises."""

import os
import tempfile

import jax
import jax.numpy as jnp
import pytest

from jaxencoder import Encoder, EncoderConfig

# Identical programs compiled by different tests (and subprocesses) hit this cache.
CACHE_DIR = os.environ.setdefault("JAX_COMPILATION_CACHE_DIR",
                                  os.path.join(tempfile.gettempdir(), "jaxencoder-test-jit-cache"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
jax.config.update("jax_default_matmul_precision", "highest")
jax.config.update("jax_numpy_rank_promotion", "raise")


def tiny_config(**overrides) -> EncoderConfig:
  """A 2-layer, 32-wide text encoder with dropout off, for fast exact tests."""
  fields = dict(vocab_size=97, num_layers=2, emb_dim=32, num_heads=4, mlp_dim=64,
                max_len=64, dropout_rate=0.0, attention_dropout_rate=0.0)
  fields.update(overrides)
  return EncoderConfig(**fields)


def random_ids(seed: int, shape, vocab: int = 97, low: int = 1) -> jax.Array:
  return jax.random.randint(jax.random.key(seed), shape, low, vocab, dtype=jnp.int32)


@pytest.fixture
def key():
  return jax.random.key(0)


STATIC = ("deterministic", "output_hidden_states", "output_attentions")


def jit_model(cfg: EncoderConfig, example, module=Encoder):
  """(variables, jitted apply) for a model; jit compiles faster than eager per shape."""
  model = module(cfg)
  variables = jax.jit(model.init)(jax.random.key(0), example)
  return variables, jax.jit(model.apply, static_argnames=STATIC)
