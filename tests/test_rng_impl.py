"""config.rng_impl: the PRNG behind the trainer's dropout keys (init stays threefry)."""

import logging

import jax
import numpy as np
import pytest

import train_helpers as th
from jaxencoder.train.config import finalize
from jaxencoder.train.loop import train_and_evaluate


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  return root, th.text_corpus(root), th.write_vocab(root)


def config_for(corpus, rng_impl: str, steps: int, **model):
  """The tiny MLM config with dropout on (0.1) and a 4-step schedule."""
  root, source, vocab = corpus
  config = th.tiny_config(root, source, vocab, **model)
  config.rng_impl, config.num_train_steps, config.optim.total_steps = rng_impl, steps, 4
  return config


@pytest.mark.slow
@pytest.mark.parametrize("rng_impl", ["rbg", "unsafe_rbg"])
def test_a_seed_reproduces_a_run_bit_exactly(corpus, tmp_path, rng_impl):
  config = config_for(corpus, rng_impl, 3)
  for name in ("a", "b"):
    train_and_evaluate(config, tmp_path / name)
  losses_a, losses_b = th.train_losses(tmp_path / "a"), th.train_losses(tmp_path / "b")
  assert len(losses_a) == 3 and np.all(np.isfinite(losses_a))
  np.testing.assert_array_equal(losses_a, losses_b)
  a, b = (th.final_params(config, tmp_path / name) for name in ("a", "b"))
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_initial_params_do_not_depend_on_rng_impl(corpus, tmp_path):
  config = {impl: config_for(corpus, impl, 1) for impl in ("threefry", "rbg")}  # setup only
  a, b = (th.final_params(config[impl], tmp_path / impl) for impl in config)
  jax.tree.map(np.testing.assert_array_equal, a, b)


@pytest.mark.slow
def test_rbg_drops_other_units_than_threefry_from_the_same_state(corpus, tmp_path, caplog):
  """Resumed from one checkpoint (rng_impl may change on resume, with a warning), the
  two implementations' dropout masks give different losses."""
  train_and_evaluate(config_for(corpus, "threefry", 4), tmp_path / "threefry")
  train_and_evaluate(config_for(corpus, "threefry", 2), tmp_path / "switched")
  with caplog.at_level(logging.WARNING, logger="jaxencoder"):
    train_and_evaluate(config_for(corpus, "rbg", 4), tmp_path / "switched")
  assert "rng_impl: 'threefry' -> 'rbg'" in caplog.text
  threefry, switched = (th.train_losses(tmp_path / d) for d in ("threefry", "switched"))
  np.testing.assert_array_equal(switched[:2], threefry[:2])
  assert all(s != t for s, t in zip(switched[2:], threefry[2:]))


@pytest.mark.slow
def test_pmap_runs_with_rbg_keys_and_hands_its_checkpoint_to_jit(corpus, tmp_path):
  config = config_for(corpus, "rbg", 2)
  config.parallelism = "pmap"
  train_and_evaluate(config, tmp_path)
  config.parallelism, config.num_train_steps = "jit", 4
  train_and_evaluate(config, tmp_path)
  losses = th.train_losses(tmp_path)
  assert len(losses) == 4 and np.all(np.isfinite(losses))


def test_an_unknown_rng_impl_is_rejected_naming_the_field(corpus):
  config = config_for(corpus, "philox", 1)
  with pytest.raises(ValueError, match="rng_impl must be one of 'threefry', 'rbg', "
                                       "'unsafe_rbg', got 'philox'"):
    finalize(config)
