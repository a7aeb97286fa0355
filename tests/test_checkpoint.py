"""Checkpointer: round trips, resume, retention, intervals, async, resharding, init_from."""

import grain
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxencoder.io.checkpoint import Checkpointer, restore_params_only
from jaxencoder.io.run_dir import RunDir

ENCODER = ("params", "encoder")  # restore_params_only's subtree: the state's encoder


@struct.dataclass
class TrainState:
  step: jax.Array
  params: dict
  opt_state: optax.OptState


def make_state(seed: int = 0, step: int = 0, head_dim: int = 3) -> TrainState:
  """Encoder (16x8 kernel, 8 bias) + head (8 x head_dim); adamw moments are nonzero."""
  k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
  params = {"encoder": {"w": jax.random.normal(k1, (16, 8)),
                        "b": jax.random.normal(k2, (8,))},
            "head": {"w": jax.random.normal(k3, (8, head_dim))}}
  tx = optax.adamw(1e-3)
  opt_state = tx.init(params)
  _, opt_state = tx.update(params, opt_state, params)  # one fake step: mu, nu, count != 0
  return TrainState(step=jnp.array(step, jnp.int32), params=params, opt_state=opt_state)


def single_device(tree):
  sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      tree)


def abstract_with(tree, mesh, spec_fn):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(
      x.shape, x.dtype, sharding=NamedSharding(mesh, spec_fn(x.shape))), tree)


def assert_identical(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    assert x.dtype == y.dtype and x.shape == y.shape
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def batches():
  return grain.MapDataset.range(100).shuffle(seed=0).to_iter_dataset().batch(4)


def ckpt(path, **kw) -> Checkpointer:
  args = dict(save_interval_steps=1, max_to_keep=3, async_save=False)
  return Checkpointer(path, **{**args, **kw})


def test_round_trip_is_bit_identical_and_data_resumes_at_next_batch(tmp_path):
  state = make_state(step=7)
  it = iter(batches())
  for _ in range(3):
    next(it)
  config = ml_collections.ConfigDict({"lr": np.float32(0.5), "mesh": (1, 8, 1), "name": "x"})
  with ckpt(tmp_path) as c:
    assert c.save(7, state, data_state=it.get_state(), config=config)
  expected_next = next(it)

  with ckpt(tmp_path) as c:
    restored, data_state, restored_config = c.restore(abstract_state=single_device(state))
  assert_identical(restored, state)
  resumed = iter(batches())
  first_of_fresh = next(iter(batches()))
  resumed.set_state(data_state)
  got = next(resumed)
  np.testing.assert_array_equal(got, expected_next)
  assert not np.array_equal(got, first_of_fresh)
  assert restored_config == {"lr": 0.5, "mesh": [1, 8, 1], "name": "x"}


def test_restore_defaults_to_latest_and_reopens_existing_run(tmp_path):
  with ckpt(tmp_path) as c:
    for step in (10, 20):
      c.save(step, make_state(seed=step, step=step))
  with ckpt(tmp_path) as c:
    assert c.latest_step() == 20 and c.all_steps() == [10, 20]
    abstract = single_device(make_state())
    latest, data_state, config = c.restore(abstract_state=abstract)
    older, _, _ = c.restore(10, abstract_state=abstract)
  assert int(latest.step) == 20 and data_state is None and config is None
  assert_identical(older, make_state(seed=10, step=10))


def test_with_data_false_skips_data_state(tmp_path):
  with ckpt(tmp_path) as c:
    c.save(1, make_state(), data_state={"next_index": 4})
    _, data_state, _ = c.restore(abstract_state=single_device(make_state()), with_data=False)
    _, with_data, _ = c.restore(abstract_state=single_device(make_state()))
  assert data_state is None and with_data == {"next_index": 4}


def test_retention_keeps_latest_k_plus_best_by_metric(tmp_path):
  losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: 3.0, 5: 6.0, 6: 7.0}
  with ckpt(tmp_path, max_to_keep=2, best_metric="loss", keep_best=1) as c:
    for step, loss in losses.items():
      c.save(step, make_state(step=step), metrics={"loss": jnp.float32(loss)})
    c.wait()
    assert c.all_steps() == [2, 5, 6]
    assert c.best_step() == 2
  with ckpt(tmp_path, best_metric="loss") as c:  # and on disk, not just in memory
    assert c.all_steps() == [2, 5, 6] and c.best_step() == 2


def test_retention_max_mode_keeps_highest(tmp_path):
  accuracy = {1: 0.9, 2: 0.1, 3: 0.2, 4: 0.3}
  with ckpt(tmp_path, max_to_keep=1, best_metric="acc", best_mode="max") as c:
    for step, acc in accuracy.items():
      c.save(step, make_state(), metrics={"acc": acc})
    assert c.all_steps() == [1, 4] and c.best_step() == 1


def test_retention_drops_old_steps_saved_without_metrics(tmp_path):
  with ckpt(tmp_path, max_to_keep=2, best_metric="loss") as c:
    for step in range(1, 6):
      c.save(step, make_state(), metrics={"loss": 1.0} if step == 2 else None)
    assert c.all_steps() == [2, 4, 5]


def test_interval_is_honoured_and_force_overrides(tmp_path):
  with ckpt(tmp_path, save_interval_steps=5, max_to_keep=10) as c:
    saved = [step for step in range(1, 13) if c.save(step, make_state(step=step))]
    assert c.save(12, make_state(step=12), force=True)
    assert not c.save(12, make_state(step=12), force=True)  # already there: no error
    assert saved == [5, 10]  # no implicit save of the first step
    assert c.all_steps() == [5, 10, 12]


def test_async_save_is_complete_after_wait(tmp_path):
  big = make_state(step=3).replace(params={"big": jnp.arange(2_000_000, dtype=jnp.float32)})
  c = ckpt(tmp_path, async_save=True)
  assert c.save(3, big)
  c.wait()
  with ckpt(tmp_path) as reader:  # a fresh manager sees a finished checkpoint
    assert reader.latest_step() == 3
    restored, _, _ = reader.restore(abstract_state=single_device(big))
  c.close()
  assert_identical(restored, big)


def test_restore_from_empty_dir_names_it(tmp_path):
  with ckpt(tmp_path / "run") as c, pytest.raises(FileNotFoundError, match="run"):
    c.restore(abstract_state=single_device(make_state()))
  with ckpt(tmp_path / "run") as c:
    c.save(1, make_state())
    with pytest.raises(FileNotFoundError, match="step 2"):
      c.restore(2, abstract_state=single_device(make_state()))


def test_metrics_without_best_metric_key_are_rejected(tmp_path):
  with ckpt(tmp_path, best_metric="loss") as c, pytest.raises(ValueError, match="loss"):
    c.save(1, make_state(), metrics={"acc": 1.0})


def _fsdp_spec(shape):  # first axis over 'fsdp', like FSDP param sharding
  return P("fsdp") if shape else P()


def _tensor_spec(shape):  # a different layout on a (4, 2) mesh
  if len(shape) == 2 and shape[1] % 2 == 0:
    return P("fsdp", "tensor")
  return P("tensor") if len(shape) == 1 else P(*(("fsdp",) if shape else ()))


@pytest.mark.mesh
def test_restore_reshards_onto_other_meshes(tmp_path):
  devices = np.array(jax.devices()[:8])
  mesh8 = Mesh(devices.reshape(1, 8, 1), ("data", "fsdp", "tensor"))
  state = make_state(step=5)
  sharded = jax.device_put(state, jax.tree.map(
      lambda x: NamedSharding(mesh8, _fsdp_spec(x.shape)), state))
  assert sharded.params["encoder"]["w"].addressable_shards[0].data.shape == (2, 8)
  with ckpt(tmp_path) as c:
    c.save(5, sharded)
    mesh42 = Mesh(devices.reshape(4, 2), ("fsdp", "tensor"))
    for abstract in (single_device(state), abstract_with(state, mesh42, _tensor_spec)):
      restored, _, _ = c.restore(abstract_state=abstract)
      assert_identical(restored, state)
      for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(abstract)):
        assert got.sharding.is_equivalent_to(want.sharding, got.ndim)
  assert restored.params["encoder"]["w"].addressable_shards[0].data.shape == (4, 4)
  abstract_encoder = abstract_with(state.params["encoder"], mesh42, _tensor_spec)
  encoder = restore_params_only(tmp_path, abstract_encoder, subtree=ENCODER)
  assert_identical(encoder, state.params["encoder"])
  assert encoder["w"].sharding == abstract_encoder["w"].sharding


def test_restore_params_only_loads_encoder_into_new_head(tmp_path):
  with ckpt(tmp_path) as c:
    c.save(1, make_state(seed=1))
    c.save(2, make_state(seed=2))
  new_model = make_state(seed=9, head_dim=5).params  # different head
  encoder = restore_params_only(tmp_path, single_device(new_model["encoder"]), subtree=ENCODER)
  assert_identical(encoder, make_state(seed=2).params["encoder"])  # latest step


def test_restore_params_only_names_mismatching_paths(tmp_path):
  with ckpt(tmp_path) as c:
    c.save(1, make_state())
  wanted = {"w": jax.ShapeDtypeStruct((16, 4), jnp.float32),
            "b": jax.ShapeDtypeStruct((8,), jnp.float32),
            "extra": jax.ShapeDtypeStruct((2,), jnp.float32)}
  with pytest.raises(ValueError) as err:
    restore_params_only(tmp_path, wanted, subtree=ENCODER)
  assert "params/encoder/w: checkpoint (16, 8) vs model (16, 4)" in str(err.value)
  assert "params/encoder/extra: checkpoint missing vs model (2,)" in str(err.value)
  assert "encoder/b" not in str(err.value)


def test_param_shapes_and_names_are_read_from_a_steps_metadata(tmp_path):
  run = RunDir(tmp_path).write_params(
      {"encoder": {"w": np.zeros((16, 8), np.float32), "b": np.zeros(8, np.float32)},
       "head": {"kernel": np.zeros((8, 3), np.float32)}}, config={})
  assert run.param_shapes(0) == {"encoder/w": (16, 8), "encoder/b": (8,), "head/kernel": (8, 3)}
  assert run.param_names() == {"encoder", "head"}


def test_restore_params_only_missing_dir_raises(tmp_path):
  with pytest.raises(FileNotFoundError, match="nowhere"):
    restore_params_only(tmp_path / "nowhere", {}, subtree=ENCODER)


@pytest.mark.parametrize("method,new", [("model_config", "stored_config"),
                                        ("restore_encoder", "restore_encoder"),
                                        ("write_encoder", "write_encoder")])
def test_a_model_side_method_that_left_run_dir_names_its_new_place(tmp_path, method, new):
  with pytest.raises(AttributeError, match=rf"^RunDir.{method} moved: "
                                           rf"jaxencoder.model.restore_targets.{new}\("):
    getattr(RunDir(tmp_path), method)


def test_relative_directory_works(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  state = {"w": np.arange(4.0)}
  ckpt = Checkpointer("relative/ckpts", save_interval_steps=1, max_to_keep=2)
  ckpt.save(1, state, force=True)
  ckpt.wait()
  restored, _, _ = ckpt.restore(abstract_state=single_device(state))
  ckpt.close()
  np.testing.assert_array_equal(restored["w"], state["w"])
