"""Sharding by logical names, checked on the arrays themselves: which mesh axes split each
kernel (shard shapes), optimizer moments laid out as their params, dims left whole when
the mesh does not divide them, params born sharded, the train step's state donated.

Output-value tests (test_train.py: equal losses on every mesh) pass with everything
replicated; these do not.
"""

import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from conftest import tiny_config
from jaxencoder.tasks import registry
from jaxencoder.train import sharding, steps
from jaxencoder.train.optim import default_optim_config, make_optimizer

pytestmark = pytest.mark.mesh

RULES = sharding.DEFAULT_RULES
BATCH, LENGTH = 8, 16

# Hand-computed from DEFAULT_RULES (vocab, mlp, heads -> tensor; embed -> fsdp; kv, layers and
# unnamed axes whole) for vocab 104 = 8 x 13, width 32, 4 heads of 8, mlp 64, 64 positions.
# {mesh (data, fsdp, tensor): {param path: shard shape on one device}}
SHARD_SHAPES = {
    (1, 8, 1): {
        "encoder/embeddings/token_embed/embedding": (104, 4),  # [vocab, embed]
        "encoder/embeddings/position_embed/embedding": (64, 4),  # [None, embed]
        "encoder/layers_0/attention/query/kernel": (4, 4, 8),  # [embed, heads, kv]
        "encoder/layers_1/attention/out/kernel": (4, 8, 4),  # [heads, kv, embed]
        "encoder/layers_0/ffn/wi/kernel": (4, 64),  # [embed, mlp]
        "encoder/layers_1/ffn/wo/kernel": (64, 4),  # [mlp, embed]
        "encoder/layers_0/ffn/wi/bias": (64,),  # [mlp]
        "mlm_head/bias": (104,),  # [vocab]
        "mlm_head/transform/kernel": (4, 32),  # [embed, None]
    },
    (2, 2, 2): {
        "encoder/embeddings/token_embed/embedding": (52, 16),
        "encoder/embeddings/position_embed/embedding": (64, 16),
        "encoder/layers_0/attention/query/kernel": (16, 2, 8),
        "encoder/layers_1/attention/out/kernel": (2, 8, 16),
        "encoder/layers_0/ffn/wi/kernel": (16, 32),
        "encoder/layers_1/ffn/wo/kernel": (32, 16),
        "encoder/layers_0/ffn/wi/bias": (32,),
        "mlm_head/bias": (52,),
        "mlm_head/transform/kernel": (16, 32),
    },
    (1, 1, 8): {
        "encoder/embeddings/token_embed/embedding": (13, 32),
        "encoder/embeddings/position_embed/embedding": (64, 32),
        "encoder/layers_0/attention/query/kernel": (32, 4, 8),  # 4 heads: 8 does not divide
        "encoder/layers_1/attention/out/kernel": (4, 8, 32),
        "encoder/layers_0/ffn/wi/kernel": (32, 8),
        "encoder/layers_1/ffn/wo/kernel": (8, 32),
        "encoder/layers_0/ffn/wi/bias": (8,),
        "mlm_head/bias": (13,),
        "mlm_head/transform/kernel": (32, 32),
    },
}


def mlm_batch(vocab: int = 104) -> dict[str, np.ndarray]:
  ids = np.asarray(jax.random.randint(jax.random.key(0), (BATCH, LENGTH), 1, vocab))
  weights = np.zeros((BATCH, LENGTH), np.float32)
  weights[:, 2::5] = 1.0
  return {"input_ids": ids.astype(np.int32), "attention_mask": np.ones_like(ids, np.int32),
          "mlm_labels": ids.astype(np.int32), "mlm_weights": weights}


def make_state(mesh_shape, **model):
  """(task, tx, state) of a tiny MLM with the default optimizer, created on the mesh."""
  task = registry.make_task("mlm", tiny_config(**{"vocab_size": 104, **model}), max_predictions=4)
  optim = default_optim_config()
  optim.total_steps = 10
  batch = mlm_batch(task.model.cfg.vocab_size)
  tx, _ = make_optimizer(optim, steps.param_shapes(task, batch), num_layers=2)
  mesh = sharding.make_mesh(mesh_shape, jax.devices()[:int(np.prod(mesh_shape))])
  state = steps.init_state(task, tx, batch, jax.random.key(0), mesh, RULES)
  return task, tx, mesh, state


def by_path(tree) -> dict[str, jax.Array]:
  """{'encoder/layers_0/ffn/wi/kernel': leaf, ...} (attribute and index keys by name)."""
  name = lambda k: str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(name(k) for k in path): leaf for path, leaf in flat}


def shard_shape(x: jax.Array) -> tuple[int, ...]:
  shapes = {s.data.shape for s in x.addressable_shards}
  assert len(shapes) == 1, shapes
  return shapes.pop()


@pytest.fixture(scope="module", params=sorted(SHARD_SHAPES), ids=str)
def mesh_state(request):
  return request.param, make_state(request.param)


def test_kernels_are_split_over_the_mesh_axes_their_rules_name(mesh_state):
  mesh_shape, (_, _, _, state) = mesh_state
  params = by_path(state.params)
  got = {path: shard_shape(params[path]) for path in SHARD_SHAPES[mesh_shape]}
  assert got == SHARD_SHAPES[mesh_shape]


def test_each_device_holds_a_different_slice_of_a_split_kernel(mesh_state):
  mesh_shape, (_, _, _, state) = mesh_state
  kernel = state.params["encoder"]["layers_0"]["ffn"]["wi"]["kernel"]  # [embed, mlp]
  slices = {tuple((s.start, s.stop) for s in shard.index) for shard in kernel.addressable_shards}
  assert len(slices) == mesh_shape[1] * mesh_shape[2]  # fsdp x tensor pieces, data replicates


def test_optimizer_moments_share_their_params_sharding(mesh_state):
  _, (_, _, _, state) = mesh_state
  params = by_path(state.params)
  checked = 0
  for path, leaf in by_path(state.opt_state).items():
    name = next((p for p in params if path.endswith("/" + p)), None)
    if name is None or leaf.shape != params[name].shape:
      continue
    assert leaf.sharding == params[name].sharding, path
    assert shard_shape(leaf) == shard_shape(params[name]), path
    checked += 1
  assert checked == 2 * len(params)  # Adam's mu and nu of every param


def test_scalars_and_the_step_are_replicated(mesh_state):
  _, (_, _, mesh, state) = mesh_state
  assert state.step.sharding.is_fully_replicated
  counts = [x for x in jax.tree.leaves(state.opt_state) if x.ndim == 0]
  assert counts and all(x.sharding.is_fully_replicated for x in counts)


@pytest.mark.slow
def test_dims_the_mesh_does_not_divide_stay_whole():
  """97 ids over 8 or 2 tensor shards, 4 heads over 8: left unsharded, not an error."""
  _, _, _, state = make_state((1, 1, 8), vocab_size=97)
  params = by_path(state.params)
  assert params["encoder/embeddings/token_embed/embedding"].sharding.spec[0] is None
  assert shard_shape(params["encoder/embeddings/token_embed/embedding"]) == (97, 32)
  assert shard_shape(params["encoder/layers_0/attention/key/kernel"]) == (32, 4, 8)
  assert shard_shape(params["encoder/layers_0/ffn/wi/kernel"]) == (32, 8)  # 64 mlp do split
  _, _, _, state = make_state((2, 2, 2), vocab_size=97)
  assert shard_shape(by_path(state.params)["encoder/embeddings/token_embed/embedding"]) == (97, 16)


def test_scanned_params_keep_their_layer_axis_whole():
  _, _, _, state = make_state((2, 2, 2), scan_layers=True)
  layers = by_path(state.params["encoder"]["layers"])
  assert layers["ffn/wi/kernel"].shape == (2, 32, 64)
  assert layers["ffn/wi/kernel"].sharding.spec == P(None, "fsdp", "tensor")
  assert shard_shape(layers["ffn/wi/kernel"]) == (2, 16, 32)
  assert shard_shape(layers["attention/query/kernel"]) == (2, 16, 2, 8)


def test_params_are_created_sharded_without_a_host_copy(monkeypatch):
  """init_state places nothing through the host (no device_put of a full array)."""
  def no_device_put(*args, **kwargs):
    raise AssertionError("init_state copied a full array through jax.device_put")
  monkeypatch.setattr(jax, "device_put", no_device_put)
  _, _, mesh, state = make_state((1, 8, 1))
  kernel = state.params["encoder"]["layers_0"]["ffn"]["wi"]["kernel"]
  assert kernel.sharding == NamedSharding(mesh, P("fsdp", "tensor"))
  assert len(kernel.addressable_shards) == 8 and shard_shape(kernel) == (4, 64)


@pytest.mark.slow
def test_train_step_donates_its_state():
  task, tx, mesh, state = make_state((2, 2, 2))
  shardings = steps.state_shardings(task, tx, mlm_batch(), mesh, RULES)
  step = steps.jit_train_step(task, tx, jax.random.key(1), shardings, mesh)
  with steps.mesh_context(mesh, RULES):
    new_state, _ = step(state, sharding.put_batch(mlm_batch(), mesh))
  jax.block_until_ready(new_state)
  assert all(x.is_deleted() for x in jax.tree.leaves(state))  # buffers reused by the new state
  assert not any(x.is_deleted() for x in jax.tree.leaves(new_state))
  assert jax.tree.map(lambda x: x.sharding, new_state) == shardings


def test_batches_are_split_over_data_and_fsdp_and_replicated_over_tensor():
  mesh = sharding.make_mesh((2, 2, 2))
  batch = sharding.put_batch(mlm_batch(), mesh)
  ids = batch["input_ids"]
  assert shard_shape(ids) == (BATCH // 4, LENGTH)
  rows = {shard.index[0].start for shard in ids.addressable_shards}
  assert rows == {0, 2, 4, 6}  # each row block on the 2 tensor devices of its (data, fsdp)
  np.testing.assert_array_equal(np.asarray(ids), mlm_batch()["input_ids"])


def test_activations_are_constrained_by_their_logical_names():
  """[B, L, D] states split their batch over data x fsdp; the [B, L, F] ffn hidden layer
  also its F over tensor."""
  task, _, mesh, state = make_state((2, 2, 2))
  ids = mlm_batch()["input_ids"]
  with steps.mesh_context(mesh, RULES):
    jaxpr = jax.make_jaxpr(lambda p: task.model.apply({"params": p}, ids))(state.params)
  specs = [e.params["sharding"].spec for e in jaxpr.jaxpr.eqns
           if e.primitive.name == "sharding_constraint"]
  assert P(("data", "fsdp"), None, None) in specs
  assert P(("data", "fsdp"), None, "tensor") in specs
  assert len(specs) >= 1 + 2 * 2  # embeddings, then per layer: block output and ffn hidden


# ------------------------------------------------------------------ helpers, no devices
def test_mesh_shape_fills_minus_one_and_names_bad_shapes():
  assert sharding.mesh_shape((-1, 2, 1), 8) == (4, 2, 1)
  assert sharding.mesh_shape((2, 2, 2), 8) == (2, 2, 2)
  with pytest.raises(ValueError, match="at most one axis may be -1"):
    sharding.mesh_shape((-1, -1, 1), 8)
  with pytest.raises(ValueError, match=r"does not divide 8 devices"):
    sharding.mesh_shape((3, -1, 1), 8)
  with pytest.raises(ValueError, match=r"needs 4 devices, have 8"):
    sharding.mesh_shape((2, 2, 1), 8)


def test_a_batch_is_split_over_the_product_of_the_data_and_fsdp_axes():
  assert sharding.batch_devices((-1, 1, 1), 8) == (8, "data=8")
  assert sharding.batch_devices((2, 4, 1), 8) == (8, "data=2, fsdp=4")
  assert sharding.batch_devices((4, 1, 2), 8) == (4, "data=4")
  assert sharding.batch_devices((1, 1, -1), 8) == (1, "data=1")


OVER_8 = "8 data-parallel devices (mesh data=8)"


@pytest.mark.parametrize("overrides, line", [
    ({"batch_size": 10}, f"batch_size=10 does not divide over {OVER_8}; use batch_size=8 or 16"),
    ({"batch_size": 4}, f"batch_size=4 does not divide over {OVER_8}; use batch_size=8"),
    ({"batch_size": 12, "mesh_shape": (2, 4, 1)}, "batch_size=12 does not divide over 8 "
     "data-parallel devices (mesh data=2, fsdp=4); use batch_size=8 or 16"),
    ({"batch_size": 6, "mesh_shape": (4, 1, 2)}, "batch_size=6 does not divide over 4 "
     "data-parallel devices (mesh data=4); use batch_size=4 or 8"),
    ({"batch_size": 5, "optim.grad_accum_steps": 2}, "batch_size=5 x optim.grad_accum_steps=2 "
     f"(10 rows a step) does not divide over {OVER_8}; use batch_size=4 or 8"),
    ({"eval_batch_size": 10}, f"eval_batch_size=10 does not divide over {OVER_8}; use "
     "eval_batch_size=8 or 16"),
    ({"batch_size": 10, "parallelism": "pmap", "mesh_shape": (4, 1, 2)}, "batch_size=10 does "
     "not divide over 8 devices (parallelism=pmap); use batch_size=8 or 16"),
])
def test_a_batch_its_devices_do_not_divide_is_refused_naming_the_nearest_that_do(overrides, line):
  from jaxencoder.train.config import apply_overrides, base_config, check_batches
  config = base_config()
  apply_overrides(config, [f"{key}={value}" for key, value in overrides.items()])
  with pytest.raises(ValueError) as error:
    check_batches(config, 8)
  assert str(error.value) == line


def test_micro_batches_need_not_divide_and_eval_only_checks_the_eval_batch():
  """The devices split each step's batch_size x grad_accum_steps rows; the micro-batches
  of a step are cut inside the compiled step (steps.split_micro_batches)."""
  from jaxencoder.train.config import apply_overrides, base_config, check_batches
  config = base_config()
  apply_overrides(config, ["batch_size=4", "optim.grad_accum_steps=2", "eval_batch_size=24"])
  check_batches(config, 8)
  apply_overrides(config, ["batch_size=3", "optim.grad_accum_steps=1"])
  check_batches(config, 8, train=False)
  check_batches(config, 1)


def test_divisible_spec_drops_only_the_axes_that_do_not_divide():
  mesh = sharding.make_mesh((2, 2, 2))
  spec = P(("data", "fsdp"), "tensor", None)
  assert sharding.divisible_spec(spec, (8, 6, 5), mesh) == spec
  assert sharding.divisible_spec(spec, (6, 6, 5), mesh) == P(None, "tensor", None)  # 6 % 4
  assert sharding.divisible_spec(spec, (8, 7, 5), mesh) == P(("data", "fsdp"), None, None)
  assert sharding.divisible_spec(P("fsdp"), (4, 3), mesh) == P("fsdp", None)


def test_unnamed_leaves_replicate_and_rules_come_from_config_lists():
  mesh = sharding.make_mesh((1, 8, 1))
  tree = {"named": nn.Partitioned(jnp.zeros((16, 3)), ("embed", None)), "plain": jnp.zeros(4)}
  got = sharding.logical_shardings(tree, mesh, RULES)
  assert got["named"].spec == P("fsdp", None) and got["plain"].spec == P()
  rules = sharding.rules_from_config([["act_batch", ["data", "fsdp"]], ["embed", "fsdp"],
                                      ["kv", None]])
  assert rules == (("act_batch", ("data", "fsdp")), ("embed", "fsdp"), ("kv", None))


@pytest.mark.slow
def test_cpu_devices_splits_the_host_before_jax_starts_and_says_when_it_cannot():
  """config.cpu_devices: 3 devices when set first; once JAX has computed, a warning."""
  script = """
import logging, jax, jax.numpy as jnp
from jaxencoder.train import sharding
logging.basicConfig(level=logging.INFO)
sharding.use_cpu_devices(3)
print("devices", jax.device_count())
jnp.zeros(1).block_until_ready()
sharding.use_cpu_devices(2)
print("devices", jax.device_count())
"""
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run([sys.executable, "-c", script], env={**env, "JAX_PLATFORMS": "cpu"},
                       capture_output=True, text=True, check=True)
  assert out.stdout.split("\n")[:2] == ["devices 3", "devices 3"]
  assert "cpu_devices=2 left: JAX already started with 3 CPU devices" in out.stderr
