"""The layer stack: scan vs loop, remat, dropout, and learning with both norm placements."""

import importlib.util
import itertools
import math
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from conftest import fast_first, jit_model, random_ids, tiny_config
from jaxencoder import Encoder, loop_to_scan, scan_to_loop
from jaxencoder.tasks import registry
from jaxencoder.train.config import encoder_config, finalize


def loss_and_grads(cfg, params, ids, mask):
  """A loss with O(1) gradients everywhere: hidden states against a fixed random target."""
  model = Encoder(cfg)
  target = jax.random.normal(jax.random.key(42), ids.shape + (cfg.emb_dim,))
  def loss_fn(p):
    out = model.apply({"params": p}, ids, attention_mask=mask)
    return jnp.sum(out.last_hidden_state * target) + jnp.sum(out.pooled)
  return jax.jit(jax.value_and_grad(loss_fn))(params)


@pytest.fixture(scope="module")
def batch():
  return random_ids(0, (2, 9)), jnp.array([[1] * 9, [1] * 6 + [0] * 3])


def test_scan_equals_loop_in_outputs_and_gradients(batch):
  ids, mask = batch
  cfg = tiny_config(num_layers=3)
  loop_params = nn.meta.unbox(Encoder(cfg).init(jax.random.key(0), ids))["params"]
  scan_params = loop_to_scan(loop_params)
  assert scan_params["layers"]["ffn"]["wi"]["kernel"].shape == (3, 32, 64)
  loss_loop, grads_loop = loss_and_grads(cfg, loop_params, ids, mask)
  loss_scan, grads_scan = loss_and_grads(cfg.replace(scan_layers=True), scan_params, ids, mask)
  np.testing.assert_allclose(loss_scan, loss_loop, rtol=1e-5)
  # float32 sums in another order: absolute error relative to the largest gradient (~70
  # here); 1e-5 absolute was passed or missed by 1.1e-5 depending on the CPU's kernels.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(
      a, b, rtol=1e-5, atol=1e-6 * max(1.0, float(np.abs(b).max()))),
      scan_to_loop(grads_scan), grads_loop)


@pytest.mark.slow
def test_scan_intermediates_match_loop(batch):
  ids, mask = batch
  cfg = tiny_config(num_layers=3)
  variables, apply = jit_model(cfg, ids)
  scan_vars = {"params": loop_to_scan(variables["params"])}
  _, apply_scan = jit_model(cfg.replace(scan_layers=True), ids)
  kw = dict(attention_mask=mask, output_hidden_states=True, output_attentions=True)
  a, b = apply(variables, ids, **kw), apply_scan(scan_vars, ids, **kw)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), a, b)


def test_layout_round_trip_is_exact():
  ids = random_ids(0, (1, 4))
  params = nn.meta.unbox(Encoder(tiny_config(num_layers=4)).init(jax.random.key(0), ids))
  back = scan_to_loop(loop_to_scan(params))
  assert jax.tree.structure(back) == jax.tree.structure(params)
  jax.tree.map(np.testing.assert_array_equal, back, params)


@pytest.mark.parametrize("scan_layers", [False, True])
@pytest.mark.parametrize("policy", fast_first(["full", "save_dots", "save_dots_no_batch"]))
def test_remat_matches_no_remat(batch, scan_layers, policy):
  ids, mask = batch
  cfg = tiny_config(scan_layers=scan_layers)
  params = nn.meta.unbox(Encoder(cfg).init(jax.random.key(0), ids))["params"]
  loss, grads = loss_and_grads(cfg, params, ids, mask)
  loss_r, grads_r = loss_and_grads(cfg.replace(remat_policy=policy), params, ids, mask)
  np.testing.assert_allclose(loss_r, loss, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), grads_r, grads)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_dropout_depends_on_rng_only_when_training(scan_layers):
  cfg = tiny_config(dropout_rate=0.3, attention_dropout_rate=0.3, scan_layers=scan_layers)
  ids = random_ids(1, (2, 8))
  variables, apply = jit_model(cfg, ids)
  run = lambda seed, det: apply(variables, ids, deterministic=det,
                                rngs={"dropout": jax.random.key(seed)}).last_hidden_state
  np.testing.assert_array_equal(run(1, True), run(2, True))
  assert float(jnp.abs(run(1, False) - run(2, False)).max()) > 1e-2
  np.testing.assert_array_equal(run(3, False), run(3, False))


def test_mlp_dropout_is_its_own_rate_and_off_by_default_like_bert():
  ids = random_ids(1, (2, 8))
  def spread(**rates):
    """Max difference between two dropout seeds in training mode, and vs eval mode."""
    cfg = tiny_config(**{"dropout_rate": 0.0, "attention_dropout_rate": 0.0, **rates})
    variables, apply = jit_model(cfg, ids)
    run = lambda seed: apply(variables, ids, deterministic=seed is None,
                             rngs={"dropout": jax.random.key(seed or 0)}).last_hidden_state
    return float(jnp.abs(run(1) - run(2)).max()), float(jnp.abs(run(1) - run(None)).max())
  assert tiny_config().mlp_dropout_rate == 0.0
  assert spread() == (0.0, 0.0)  # only the F-wide hidden layer could still drop: it does not
  seeds, vs_eval = spread(mlp_dropout_rate=0.3)
  assert seeds > 1e-2 and vs_eval > 1e-2


def _memorise(cfg, steps: int = 40) -> tuple[float, float]:
  """Trains encoder + linear readout to recall 4 token sequences' labels; (first, last) loss."""
  ids = random_ids(5, (8, 6))
  labels = jax.random.randint(jax.random.key(6), (8, 6), 0, 5)
  model = Encoder(cfg)
  params = {"encoder": model.init(jax.random.key(0), ids)["params"],
            "readout": jnp.zeros((cfg.emb_dim, 5))}
  opt = optax.adam(3e-3)
  def loss_fn(p):
    h = model.apply({"params": p["encoder"]}, ids).last_hidden_state
    return optax.softmax_cross_entropy_with_integer_labels(h @ p["readout"], labels).mean()
  @jax.jit
  def step(p, state):
    loss, grads = jax.value_and_grad(loss_fn)(p)
    updates, state = opt.update(grads, state, p)
    return optax.apply_updates(p, updates), state, loss
  state = opt.init(params)
  losses = []
  for _ in range(steps):
    params, state, loss = step(params, state)
    losses.append(float(loss))
  return losses[0], losses[-1]


@pytest.mark.parametrize("norm_position, norm", fast_first([
    ("post", "layernorm"), ("pre", "layernorm"), ("pre", "rmsnorm")]))
def test_both_norm_placements_learn_a_memorisation_task(norm_position, norm):
  first, last = _memorise(tiny_config(norm_position=norm_position, norm=norm))
  assert first > 1.4  # ~log(5) at start
  assert last < 0.1 * first


@pytest.mark.slow
def test_every_activation_runs_in_the_encoder_and_differs():
  """Same params, another activation: other outputs (each formula: test_activations_and_norms).
  Weights of std 0.5 put pre-activations at O(1), where gelu and its tanh form part (at
  BERT's 0.02 they agree to 1e-7)."""
  ids = random_ids(0, (1, 5))
  outs = {}
  for activation in ("gelu", "gelu_tanh", "relu", "swiglu", "geglu"):
    cfg = tiny_config(activation=activation, initializer_range=0.5)
    variables, apply = jit_model(cfg, ids)
    outs[activation] = np.asarray(apply(variables, ids).last_hidden_state)
    assert np.all(np.isfinite(outs[activation]))
    gated = activation in ("swiglu", "geglu")
    assert set(variables["params"]["layers_0"]["ffn"]) == (
        {"wi_gate", "wi_up", "wo"} if gated else {"wi", "wo"})
  for a, b in itertools.combinations(outs, 2):
    assert np.abs(outs[a] - outs[b]).max() > 1e-4, (a, b)


@pytest.mark.parametrize("overrides", fast_first([
    dict(), dict(scan_layers=True, num_layers=3, norm_position="pre"), dict(norm_position="pre"),
    dict(position_embedding="rope"),
    dict(position_embedding="relative"), dict(attention_impl="fused"),
    dict(attention_impl="linear"), dict(remat_policy="full"), dict(pooler_dense=True),
    dict(scan_layers=True), dict(pooling="mean"),
    dict(scan_layers=True, num_layers=1), dict(scan_layers=True, position_embedding="rope"),
    dict(scan_layers=True, remat_policy="save_dots"),
    dict(scan_layers=True, remat_policy="full", position_embedding="relative"),
], 2))
def test_output_positions_equal_the_full_states_at_those_rows(overrides):
  """The sparse last block (or the gather fallback) changes no value nor gradient; for the
  scanned stack, gradients reach all N slices of the stored [N] params."""
  cfg = tiny_config(**overrides)
  ids = random_ids(3, (2, 9))
  mask = jnp.array([[1] * 9, [1] * 6 + [0] * 3])
  rows = jnp.array([[3, 8, 1], [5, 2, 2]])
  model = Encoder(cfg)
  params = model.init(jax.random.key(0), ids, attention_mask=mask)["params"]
  target = jax.random.normal(jax.random.key(4), (2, 3, cfg.emb_dim))

  def loss(p, sparse):
    out = model.apply({"params": p}, ids, attention_mask=mask,
                      output_positions=rows if sparse else None)
    picked = out.last_hidden_state if sparse else jnp.take_along_axis(
        out.last_hidden_state, rows[..., None], 1)
    return jnp.sum(picked * target) + jnp.sum(out.pooled), (picked, out.pooled)

  grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True), static_argnums=1)
  (_, (full_rows, full_pooled)), full_grads = grad_fn(params, False)
  (_, (rows_out, pooled)), grads = grad_fn(params, True)
  assert rows_out.shape == (2, 3, cfg.emb_dim)
  np.testing.assert_allclose(rows_out, full_rows, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(pooled, full_pooled, rtol=1e-5, atol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
               grads, full_grads)


def _forward_flops(cfg, ids, positions) -> float:
  """XLA's count for one forward pass; it counts a loop body once, whatever its trip count."""
  model = Encoder(cfg)
  params = model.init(jax.random.key(0), ids)["params"]
  forward = lambda p: model.apply({"params": p}, ids, output_positions=positions)
  return jax.jit(forward).lower(params).compile().cost_analysis()["flops"]


def test_output_positions_skip_work_in_the_last_block():
  cfg = tiny_config(num_layers=1, mlp_dim=256)
  ids = random_ids(3, (2, 32))
  rows = jnp.array([[3, 8], [5, 2]])
  # Queries, feed-forward and norms for 1 + 2 rows instead of 32: well under half.
  assert _forward_flops(cfg, ids, rows) < 0.5 * _forward_flops(cfg, ids, None)


@pytest.mark.parametrize("num_layers", fast_first([1, 2]))
def test_scanned_stack_also_skips_work_in_the_last_block(num_layers):
  """With at most 2 layers the sparse scan runs at most 1 step before the last block, so
  XLA's count is exact: it must equal the looped stack's sparse count."""
  cfg = tiny_config(num_layers=num_layers, mlp_dim=256)
  ids = random_ids(3, (2, 32))
  rows = jnp.array([[3, 8], [5, 2]])
  sparse = _forward_flops(cfg.replace(scan_layers=True), ids, rows)
  np.testing.assert_allclose(sparse, _forward_flops(cfg, ids, rows), rtol=0.01)
  assert sparse < (1 - 0.5 / num_layers) * _forward_flops(cfg, ids, None)  # > half a layer saved
  if num_layers == 1:  # no loop at all in either path
    assert sparse < 0.5 * _forward_flops(cfg.replace(scan_layers=True), ids, None)


@pytest.mark.slow
def test_scanned_sparse_path_takes_plain_params_and_draws_dropout():
  cfg = tiny_config(num_layers=3, scan_layers=True, remat_policy="full", dropout_rate=0.3,
                    attention_dropout_rate=0.3)
  ids = random_ids(1, (2, 8))
  rows = jnp.array([[3, 5], [1, 7]])
  model = Encoder(cfg)
  params = nn.meta.unbox(model.init(jax.random.key(0), ids)["params"])
  run = jax.jit(lambda seed: model.apply(
      {"params": params}, ids, output_positions=rows, deterministic=False,
      rngs={"dropout": jax.random.key(seed)}).last_hidden_state)
  assert run(1).shape == (2, 2, cfg.emb_dim)
  np.testing.assert_array_equal(run(1), run(1))
  assert float(jnp.abs(run(1) - run(2)).max()) > 1e-2


def _load_config(name: str):
  path = pathlib.Path(__file__).parents[1] / "configs" / f"{name}.py"
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return finalize(module.get_config())


@pytest.mark.slow
def test_bert_base_mlm_config_gets_the_sparse_last_block():
  """configs/mlm_bert_base.py scans its layers and gathers MLM logits (auto max_predictions);
  shrunk to one layer, its MLM loss costs what the looped stack's sparse path does."""
  config = _load_config("mlm_bert_base")
  cfg = encoder_config(config)
  assert cfg.scan_layers and config.max_predictions > 0
  small = cfg.replace(num_layers=1, emb_dim=32, num_heads=4, head_dim=None, mlp_dim=256,
                      vocab_size=97, max_len=64)
  ids = random_ids(0, (2, 32))
  weights = jnp.zeros((2, 32)).at[:, 3:32:6].set(1.0)
  batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids), "mlm_labels": ids,
           "mlm_weights": weights}
  max_predictions = math.ceil(config.max_predictions / config.data.seq_len * 32)

  def flops(model_cfg):
    task = registry.make_task("mlm", model_cfg, max_predictions=max_predictions)
    params = task.model.init(jax.random.key(0), *task.example_batch(batch))["params"]
    loss = lambda p: task.loss_fn(p, batch, jax.random.key(0), False)[0]
    return jax.jit(loss).lower(params).compile().cost_analysis()["flops"]
  np.testing.assert_allclose(flops(small), flops(small.replace(scan_layers=False)), rtol=0.01)
