"""Optimizer: schedules, weight-decay mask, layer-wise LR decay, multipliers, freezing,
clipping, on the param trees of a 3-layer MLM model (both layouts)."""

import re

import flax.linen as nn
from flax import traverse_util
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxencoder import EncoderConfig, EncoderForMaskedLM
from jaxencoder.train.optim import (default_optim_config, learning_rate_schedule, make_optimizer,
                              param_multipliers, path_str, trainable_mask,
                              weight_decay_mask)

N = 3
# A subset of the real leaves (one of each kind), so each optimizer compiles in ~1 s.
KEPT = (r"embeddings/(token_embed|position_embed|norm/scale)|attention/(query|out/bias)"
        r"|ffn/(wi|wo/kernel)|ffn_norm/scale|mlm_head/(bias|transform/kernel|norm/scale)")


def model_params(scan: bool):
  """Random values in (part of) the tree of a tiny 3-layer EncoderForMaskedLM."""
  cfg = EncoderConfig.preset("tiny", vocab_size=50, num_layers=N, emb_dim=16, num_heads=2,
                             max_len=8, scan_layers=scan)
  ids = jnp.ones((1, 4), jnp.int32)
  shapes = nn.meta.unbox(jax.eval_shape(EncoderForMaskedLM(cfg).init, jax.random.key(0), ids))
  flat = traverse_util.flatten_dict(shapes["params"], sep="/")
  kept = {k: v for k, v in flat.items() if re.search(KEPT, k)}
  return random_like(traverse_util.unflatten_dict(kept, sep="/"), seed=1)


def random_like(tree, seed: int, scale: float = 1.0):
  """Standard normals (numpy: no per-shape compilation) in the structure of tree."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: jnp.asarray(scale * rng.standard_normal(x.shape), jnp.float32),
                      tree)


@pytest.fixture(scope="module")
def loop_params():
  return model_params(scan=False)


@pytest.fixture(scope="module")
def scan_params():
  return model_params(scan=True)


@pytest.fixture(params=["loop", "scan"])
def params(request, loop_params, scan_params):
  return loop_params if request.param == "loop" else scan_params


def config(**overrides):
  cfg = default_optim_config()
  cfg.update({"schedule": "constant", "learning_rate": 0.1, "grad_clip_norm": 0.0, **overrides})
  return cfg


def global_norm(tree) -> float:
  return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64)))
                           for x in jax.tree.leaves(tree))))


def assert_all_changed(new, old):
  for now, before in zip(jax.tree.leaves(new), jax.tree.leaves(old)):
    assert not np.array_equal(now, before)


def by_path(tree) -> dict:
  return {path_str(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def run_steps(cfg, params, grads_list):
  """Applies one jitted update per grads tree; returns (params, last updates, state)."""
  tx, _ = make_optimizer(cfg, params, num_layers=N)

  @jax.jit
  def step(grads, state, params):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), updates, state
  state = jax.jit(tx.init)(params)
  for grads in grads_list:
    params, updates, state = step(grads, state, params)
  return params, updates, state


# Schedules.

@pytest.mark.parametrize("schedule, expected", [
    # steps:        0    5    10 (warmup end)  60 (mid)  110 (total)  1000
    ("linear",      [0., .5, 1., .55, .1, .1]),
    ("cosine",      [0., .5, 1., .55, .1, .1]),
    ("inverse_sqrt", [0., .5, 1., np.sqrt(10 / 60), np.sqrt(10 / 110), .1]),
    ("constant",    [0., .5, 1., 1., 1., 1.]),
])
def test_schedule_values_at_boundaries(schedule, expected):
  lr_fn = learning_rate_schedule(config(schedule=schedule, learning_rate=1.0, warmup_steps=10,
                                        total_steps=110, end_lr_factor=0.1))
  got = [float(lr_fn(s)) for s in (0, 5, 10, 60, 110, 1000)]
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_cosine_quarter_point_is_on_the_cosine():
  lr_fn = learning_rate_schedule(config(schedule="cosine", learning_rate=2.0, total_steps=100))
  np.testing.assert_allclose(float(lr_fn(25)), 2.0 * 0.5 * (1 + np.cos(np.pi / 4)), rtol=1e-6)


def test_no_warmup_starts_at_peak():
  lr_fn = learning_rate_schedule(config(schedule="linear", learning_rate=0.3, total_steps=10))
  assert float(lr_fn(0)) == pytest.approx(0.3)
  assert float(jax.jit(lr_fn)(jnp.int32(5))) == pytest.approx(0.15)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_decaying_schedule_needs_total_steps_beyond_warmup(schedule):
  with pytest.raises(ValueError, match="total_steps"):
    learning_rate_schedule(config(schedule=schedule, warmup_steps=10, total_steps=10))


@pytest.mark.parametrize("key, value, message", [
    ("name", "sgd", r"name='sgd'.*adamw"),
    ("schedule", "step", r"schedule='step'.*cosine"),
])
def test_unknown_choice_raises_naming_key_and_allowed_values(loop_params, key, value, message):
  with pytest.raises(ValueError, match=message):
    make_optimizer(config(**{key: value}), loop_params, num_layers=N)


def test_unknown_config_key_raises(loop_params):
  cfg = config()
  cfg.warmup_step = 3  # typo for warmup_steps
  with pytest.raises(ValueError, match="warmup_step"):
    make_optimizer(cfg, loop_params, num_layers=N)


BAD_VALUES = [
    ("learning_rate", -1.0, "a number > 0"), ("learning_rate", 0.0, "a number > 0"),
    ("warmup_steps", -5, "an integer >= 0"), ("weight_decay", -1.0, "a number >= 0"),
    ("grad_clip_norm", -0.5, "a number >= 0"), ("grad_accum_steps", 0, "an integer >= 1"),
]


@pytest.mark.parametrize("key, value, allowed", BAD_VALUES)
def test_a_value_that_cannot_be_right_raises_naming_key_and_range(loop_params, key, value,
                                                                  allowed):
  line = f"optim.{key}={value!r} cannot be right: it must be {allowed}"
  with pytest.raises(ValueError, match=re.escape(line)):
    make_optimizer(config(**{key: value}), loop_params, num_layers=N)


@pytest.mark.parametrize("key, value, allowed", BAD_VALUES)
def test_finalize_refuses_a_value_that_cannot_be_right(key, value, allowed):
  from jaxencoder.train.config import base_config, finalize
  cfg = base_config()
  cfg.optim[key] = value
  with pytest.raises(ValueError, match=re.escape(f"optim.{key}={value!r} cannot be right")):
    finalize(cfg)


def test_the_edges_of_the_ranges_are_accepted():
  from jaxencoder.train.optim import check
  check(config(warmup_steps=0, weight_decay=0.0, grad_clip_norm=None, grad_accum_steps=1,
               learning_rate=1e-9))


# Weight decay.

def test_weight_decay_mask_skips_biases_norms_and_optionally_embeddings(params):
  layer = "layers" if "layers" in params["encoder"] else "layers_1"
  default = by_path(weight_decay_mask(params, config()))
  assert default[f"encoder/{layer}/attention/query/kernel"]  # [D, H, K]
  assert default[f"encoder/{layer}/ffn/wi/kernel"]
  assert not default[f"encoder/{layer}/attention/query/bias"]  # [H, K]: 2-D, still a bias
  assert not default[f"encoder/{layer}/ffn/wi/bias"]
  assert not default[f"encoder/{layer}/ffn_norm/scale"]
  assert not default["encoder/embeddings/norm/scale"]
  assert not default["mlm_head/bias"]
  assert default["mlm_head/transform/kernel"]
  assert default["encoder/embeddings/token_embed/embedding"]
  no_embed = by_path(weight_decay_mask(params, config(decay_embeddings=False)))
  assert not no_embed["encoder/embeddings/token_embed/embedding"]
  assert not no_embed["encoder/embeddings/position_embed/embedding"]
  assert no_embed[f"encoder/{layer}/ffn/wi/kernel"]


@pytest.mark.parametrize("name", ["adamw", "adafactor", "lion"])
def test_weight_decay_is_lr_times_wd_at_a_mid_schedule_step(params, name):
  """With zero gradients every optimizer's update is its decoupled decay alone: at step t a
  decayed leaf becomes p * (1 - lr(t) * wd) (AdamW's and Lion's -lr * wd * p, Adafactor's
  rate = wd * lr(t)); biases and norm scales stay. Step 5 of a warmup-then-linear schedule
  has an LR unlike its neighbours', so a schedule read at the wrong step fails."""
  wd, t = 0.5, 5
  cfg = config(name=name, weight_decay=wd, schedule="linear", warmup_steps=2, total_steps=10)
  tx, lr_fn = make_optimizer(cfg, params, num_layers=N)
  zeros = jax.tree.map(jnp.zeros_like, params)
  state, update = jax.jit(tx.init)(params), jax.jit(tx.update)
  current = params
  for _ in range(t):  # decay at steps 0 .. t - 1
    updates, state = update(zeros, state, current)
    current = optax.apply_updates(current, updates)
  updates, state = update(zeros, state, current)
  new, old = by_path(optax.apply_updates(current, updates)), by_path(current)
  decays = by_path(weight_decay_mask(params, cfg))
  lr = float(lr_fn(t))
  assert lr not in (float(lr_fn(t - 1)), float(lr_fn(t + 1)))
  for leaf, decayed in decays.items():
    if decayed:
      np.testing.assert_allclose(new[leaf], old[leaf] * (1 - lr * wd), rtol=1e-6, err_msg=leaf)
    else:
      np.testing.assert_array_equal(new[leaf], old[leaf], err_msg=leaf)
  assert any(decays.values()) and not all(decays.values())
  kinds = {leaf.rsplit("/", 1)[-1] for leaf, decayed in decays.items() if not decayed}
  assert {"bias", "scale"} <= kinds


# Layer-wise LR decay and regex multipliers.

def test_layer_decay_multipliers_looped(loop_params):
  m = by_path(param_multipliers(loop_params, config(layer_decay=0.5), N))
  assert m["mlm_head/transform/kernel"] == 1.0
  assert m["encoder/layers_2/ffn/wi/kernel"] == 0.5
  assert m["encoder/layers_1/attention/out/bias"] == 0.25
  assert m["encoder/layers_0/ffn_norm/scale"] == 0.125
  assert m["encoder/embeddings/token_embed/embedding"] == 0.0625


def test_layer_decay_multipliers_scanned(scan_params):
  m = by_path(param_multipliers(scan_params, config(layer_decay=0.5), N))
  kernel = m["encoder/layers/attention/query/kernel"]  # leaf [N, D, H, K]
  assert kernel.shape == (N, 1, 1, 1)
  np.testing.assert_array_equal(kernel.ravel(), [0.125, 0.25, 0.5])
  assert m["encoder/layers/ffn_norm/scale"].shape == (N, 1)
  assert m["encoder/embeddings/norm/scale"] == 0.0625
  assert m["mlm_head/bias"] == 1.0


def test_layer_decay_scales_the_applied_updates(params):
  grads = [random_like(params, seed=2)]
  _, plain, _ = run_steps(config(), params, grads)
  _, decayed, _ = run_steps(config(layer_decay=0.5), params, grads)
  expected = jax.tree.map(lambda u, m: np.asarray(u) * m, plain,
                          param_multipliers(params, config(layer_decay=0.5), N))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-12),
               decayed, expected)
  emb = "encoder/embeddings/token_embed/embedding"
  assert np.abs(by_path(decayed)[emb]).max() < 0.07 * np.abs(by_path(plain)[emb]).max()


@pytest.mark.parametrize("option", [dict(layer_decay=0.5), dict(freeze_layers=1)])
def test_layer_rules_on_a_tree_without_layers_raise_instead_of_going_flat(loop_params, option):
  renamed = {"encoder": {k.replace("layers_", "block_"): v
                         for k, v in loop_params["encoder"].items()}}
  with pytest.raises(ValueError, match=r"no parameter path has a looped.*top-level names: "
                                       r"\['encoder'\]"):
    make_optimizer(config(**option), renamed, num_layers=N)


def test_regex_multipliers_first_match_wins_and_compose_with_layer_decay(loop_params):
  rules = [("ffn/wi", 3.0), ("ffn", 2.0), ("mlm_head", 10.0)]
  cfg = config(layer_decay=0.5, lr_multipliers=rules)
  m = by_path(param_multipliers(loop_params, cfg, N))
  assert m["encoder/layers_2/ffn/wi/kernel"] == 1.5
  assert m["encoder/layers_2/ffn/wo/kernel"] == 1.0
  assert m["encoder/layers_0/ffn/wi/bias"] == 0.375
  assert m["encoder/layers_0/attention/query/kernel"] == 0.125
  assert m["mlm_head/norm/scale"] == 10.0


def test_regex_that_matches_nothing_raises(loop_params):
  with pytest.raises(ValueError, match="matches no parameter"):
    make_optimizer(config(freeze=["decoder"]), loop_params, num_layers=N)


def test_boxed_params_raise(loop_params):
  boxed = jax.tree.map(lambda x: nn.Partitioned(x, names=(None,) * x.ndim), loop_params)
  with pytest.raises(ValueError, match="unbox"):
    make_optimizer(config(), boxed, num_layers=N)


def test_num_layers_must_match_the_params(params):
  with pytest.raises(ValueError, match="num_layers"):
    make_optimizer(config(), params, num_layers=N + 1)


# Freezing.

def test_freeze_encoder_keeps_encoder_bit_identical_and_trains_the_head(loop_params):
  grads = [random_like(loop_params, seed=s) for s in range(3)]
  new, _, state = run_steps(config(freeze_encoder=True, grad_clip_norm=1.0), loop_params, grads)
  jax.tree.map(np.testing.assert_array_equal, new["encoder"], loop_params["encoder"])
  assert_all_changed(new["mlm_head"], loop_params["mlm_head"])
  head_size = sum(x.size for x in jax.tree.leaves(loop_params["mlm_head"]))
  state_size = sum(np.size(x) for x in jax.tree.leaves(state))
  assert state_size <= 2 * head_size + 8  # Adam moments for the head only, plus counters


def test_trainable_mask_reports_frozen_leaves(params):
  cfg = config(freeze=["attention/(query|key)"], freeze_layers=1)
  mask = by_path(trainable_mask(params, cfg))
  assert mask["encoder/embeddings/token_embed/embedding"] is False
  assert mask["mlm_head/bias"] is True
  if "layers" in params["encoder"]:
    np.testing.assert_array_equal(mask["encoder/layers/ffn/wi/kernel"], [False, True, True])
    assert mask["encoder/layers/attention/query/kernel"] is False
  else:
    assert mask["encoder/layers_0/ffn/wi/kernel"] is False
    assert mask["encoder/layers_1/ffn/wi/kernel"] is True
    assert mask["encoder/layers_2/attention/query/bias"] is False


def test_freeze_layers_looped(loop_params):
  new, _, _ = run_steps(config(freeze_layers=2, grad_clip_norm=1.0), loop_params,
                        [random_like(loop_params, seed=s) for s in range(3)])
  old = loop_params["encoder"]
  for key in ("embeddings", "layers_0", "layers_1"):
    jax.tree.map(np.testing.assert_array_equal, new["encoder"][key], old[key])
  assert_all_changed(new["encoder"]["layers_2"], old["layers_2"])
  assert_all_changed(new["mlm_head"], loop_params["mlm_head"])


def test_freeze_layers_scanned_zeroes_the_lower_indices(scan_params):
  cfg = config(freeze_layers=2, layer_decay=0.8, name="lion", grad_clip_norm=1.0)
  new, _, _ = run_steps(cfg, scan_params, [random_like(scan_params, seed=s) for s in range(3)])
  jax.tree.map(np.testing.assert_array_equal, new["encoder"]["embeddings"],
               scan_params["encoder"]["embeddings"])
  for old, now in zip(jax.tree.leaves(scan_params["encoder"]["layers"]),
                      jax.tree.leaves(new["encoder"]["layers"])):
    np.testing.assert_array_equal(now[:2], old[:2])
    assert not np.array_equal(now[2], old[2])


def test_frozen_slices_do_not_count_in_the_clipping_norm(scan_params):
  grads = random_like(scan_params, seed=3, scale=1e-3)
  layers = grads["encoder"]["layers"]
  grads["encoder"]["layers"] = jax.tree.map(lambda g: g.at[0].set(1e3), layers)  # frozen index
  big_eps = dict(eps=1e6, weight_decay=0.0, learning_rate=1.0)  # update ~ grad / eps
  _, updates, _ = run_steps(config(freeze_layers=1, grad_clip_norm=1.0, **big_eps),
                            scan_params, [grads])
  _, unclipped, _ = run_steps(config(freeze_layers=1, grad_clip_norm=0.0, **big_eps),
                              scan_params, [grads])
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), updates, unclipped)


# Clipping (accumulation is the train step's: tests/test_train_step.py).

@pytest.mark.parametrize("clip, expected_norm", [(1.0, 1.0), (0.0, 100.0)])
def test_clipping_caps_the_global_norm(loop_params, clip, expected_norm):
  params = {"mlm_head": loop_params["mlm_head"]}
  grads = random_like(params, seed=4)
  grads = jax.tree.map(lambda g, norm=global_norm(grads): g * 100.0 / norm, grads)
  # With eps >> |g| Adam's first update is -lr * g / eps: linear in the clipped gradient.
  cfg = config(eps=1e8, weight_decay=0.0, learning_rate=1.0, grad_clip_norm=clip)
  _, updates, _ = run_steps(cfg, params, [grads])
  np.testing.assert_allclose(global_norm(updates) * 1e8, expected_norm, rtol=1e-5)


# Other optimizers and inputs.

@pytest.mark.parametrize("name", ["adafactor", "lion", "adamw"])
def test_optimizer_reduces_a_quadratic_and_respects_freezing(loop_params, name):
  loss = lambda p: sum(jnp.sum(x ** 2) for x in jax.tree.leaves(p))
  tx, _ = make_optimizer(config(name=name, learning_rate=0.01, freeze=["embeddings"]),
                         loop_params, num_layers=N)

  @jax.jit
  def step(params, state):
    updates, state = tx.update(jax.grad(loss)(params), state, params)
    return optax.apply_updates(params, updates), state
  params, state = loop_params, jax.jit(tx.init)(loop_params)
  for _ in range(5):
    params, state = step(params, state)
  assert float(jax.jit(loss)(params)) < float(jax.jit(loss)(loop_params))
  jax.tree.map(np.testing.assert_array_equal, params["encoder"]["embeddings"],
               loop_params["encoder"]["embeddings"])


def test_builds_and_inits_from_shapes(scan_params):
  shapes = jax.eval_shape(lambda: scan_params)
  cfg = config(freeze_layers=1, layer_decay=0.9, grad_accum_steps=2)
  tx, lr_fn = make_optimizer(cfg, shapes, num_layers=N)
  state_shapes = jax.eval_shape(tx.init, shapes)
  assert jax.tree.structure(state_shapes) == jax.tree.structure(jax.jit(tx.init)(scan_params))
  assert float(lr_fn(0)) == pytest.approx(0.1)
