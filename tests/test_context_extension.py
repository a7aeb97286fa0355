"""Context extension (ModernBERT's phase 2): `init_from` a run trained on short rows into a
config with 4x longer rows and a new global RoPE base. The scanned layout is kept, the
MLM head comes along (same task), and the first step starts where the source left off."""

import jax
import ml_collections
import jax.numpy as jnp
import numpy as np
import pytest

import train_helpers as th
from jaxencoder.tasks import registry
from jaxencoder.train import init_from
from jaxencoder.train.config import encoder_config
from jaxencoder.train.loop import train_and_evaluate

MODERN = dict(num_layers=4, position_embedding="rope", rope_base=10_000.0,
              local_rope_base=10_000.0, global_attention_every=3, sliding_window=4,
              activation="geglu", norm_position="pre", first_attention_norm=False,
              use_bias=False, norm_bias=False, type_vocab_size=0, scan_layers=True,
              dropout_rate=0.0, attention_dropout_rate=0.0, max_len=64, family="modernbert")


def phase1(tmp_path, corpus, vocab):
  config = th.tiny_config(tmp_path, corpus, vocab, **MODERN)
  config.data.packing, config.data.mask_rate = "best_fit", 0.3
  config.optim.schedule, config.optim.warmup_steps = "wsd", 2
  config.num_train_steps, config.eval_every, config.checkpoint_every = 80, 80, 80
  config.optim.learning_rate = 1e-2
  return config


def mlm_loss(config, params, batch) -> float:
  """The task's own MLM loss (eval mode) of `params` on `batch`, logits at every row."""
  config = ml_collections.ConfigDict(config.to_dict())
  config.max_predictions = 0  # the batch's rows are shorter than the config's
  task = registry.task_from_config(config, encoder_config(config), num_classes=0)
  loss, _ = jax.jit(lambda p: task.loss_fn(p, batch, jax.random.key(0), False))(params)
  return float(loss)


def short_batch(vocab_size: int):
  """16-token rows (phase 1's length) with every 4th real token a target."""
  rng = np.random.default_rng(0)
  ids = rng.integers(5, vocab_size, (8, 16)).astype(np.int32)
  weights = np.zeros_like(ids, np.float32)
  weights[:, 1::4] = 1.0
  return {"input_ids": jnp.asarray(ids), "attention_mask": jnp.ones_like(ids),
          "mlm_labels": jnp.asarray(ids), "mlm_weights": jnp.asarray(weights)}


@pytest.mark.slow
def test_a_longer_context_with_a_new_rope_base_starts_where_the_source_left_off(tmp_path):
  data = th.text_corpus(tmp_path, docs=200, distinct=3), th.write_vocab(tmp_path)
  source = phase1(tmp_path, *data)
  train_and_evaluate(source, tmp_path / "phase1")
  longer = phase1(tmp_path, *data)
  longer.init_from = str(tmp_path / "phase1")
  longer.data.seq_len, longer.num_train_steps = 64, 1
  longer.eval_every = longer.checkpoint_every = 1
  longer.model.rope_base, longer.model_overrides = 160_000.0, ("rope_base",)
  adopted = init_from.finalized(longer)
  assert adopted.model.rope_base == 160_000.0 and adopted.model.scan_layers
  train_and_evaluate(longer, tmp_path / "phase2")

  first_loss, learned = th.train_losses(tmp_path / "phase2")[0], th.train_losses(
      tmp_path / "phase1")
  # Phase 2's first step starts where phase 1 ended (mean of its last 5 steps), far below
  # where phase 1 started from scratch: the encoder and the MLM head came along.
  ended = np.mean(learned[-5:])
  assert np.isfinite(first_loss) and ended < 0.85 * learned[0]
  assert first_loss < 0.85 * learned[0] and abs(first_loss - ended) < 0.15 * ended
  # At phase 1's length the new base (a config field, not a param) moves the loss a little.
  params = th.final_params(source, tmp_path / "phase1")
  batch = short_batch(adopted.model.vocab_size)
  loss_before, loss_after = mlm_loss(source, params, batch), mlm_loss(adopted, params, batch)
  assert np.isfinite(loss_after) and abs(loss_after - loss_before) < 0.1 * loss_before
