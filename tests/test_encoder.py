"""Encoder front ends, output shapes, pooling, sharding annotations and input errors."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import jit_model, random_ids, tiny_config
from jaxencoder import Encoder


def run(cfg, inputs, **kwargs):
  variables, apply = jit_model(cfg, inputs)
  return apply(variables, inputs, **kwargs), variables


@pytest.mark.parametrize("pooling", ["cls", "mean", "max", "attention"])
def test_text_shapes_for_every_pooling(pooling):
  cfg = tiny_config(pooling=pooling)
  ids = random_ids(0, (3, 11))
  out, _ = run(cfg, ids, output_hidden_states=True, output_attentions=True)
  assert out.last_hidden_state.shape == (3, 11, 32)
  assert out.pooled.shape == (3, 32)
  assert len(out.hidden_states) == cfg.num_layers + 1
  assert all(h.shape == (3, 11, 32) for h in out.hidden_states)
  assert [a.shape for a in out.attentions] == [(3, 4, 11, 11)] * cfg.num_layers
  np.testing.assert_allclose(out.hidden_states[-1], out.last_hidden_state)
  np.testing.assert_allclose(jnp.sum(out.attentions[0], -1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean", "max", "attention"])
def test_image_patches_shapes(pooling):
  cfg = tiny_config(input_kind="image", image_size=(28, 28), patch_size=7, num_channels=1,
                    pooling=pooling)
  images = jax.random.normal(jax.random.key(1), (2, 28, 28, 1))
  out, variables = run(cfg, images)
  assert out.last_hidden_state.shape == (2, 16 + 1, 32)  # 4x4 patches + [CLS]
  assert out.pooled.shape == (2, 32)
  kernel = nn.meta.unbox(variables)["params"]["embeddings"]["patch_embed"]["kernel"]
  assert kernel.shape == (7 * 7 * 1, 32)


def test_image_without_cls_and_2d_sinusoids_accepts_other_sizes():
  cfg = tiny_config(input_kind="image", image_size=(16, 16), patch_size=4, num_channels=3,
                    use_cls_token=False, pooling="mean", position_embedding="sinusoidal")
  variables, apply = jit_model(cfg, jnp.zeros((1, 16, 16, 3)))
  out = apply(variables, jnp.ones((2, 24, 32, 3)))
  assert out.last_hidden_state.shape == (2, 6 * 8, 32)


@pytest.mark.parametrize("pooling", ["cls", "mean", "max", "attention"])
def test_series_shapes(pooling):
  cfg = tiny_config(input_kind="series", input_features=3, pooling=pooling)
  series = jax.random.normal(jax.random.key(2), (4, 20, 3))
  out, _ = run(cfg, series, attention_mask=jnp.ones((4, 20), jnp.int32))
  assert out.last_hidden_state.shape == (4, 21, 32)
  assert out.pooled.shape == (4, 32)


def test_patchify_is_row_major_non_overlapping():
  from jaxencoder.model.embeddings import patchify
  image = jnp.arange(4 * 4, dtype=jnp.float32).reshape(1, 4, 4, 1)
  patches = patchify(image, 2)
  np.testing.assert_array_equal(patches[0, 0], [0, 1, 4, 5])
  np.testing.assert_array_equal(patches[0, 1], [2, 3, 6, 7])
  np.testing.assert_array_equal(patches[0, 3], [10, 11, 14, 15])


def test_bfloat16_compute_keeps_float32_params():
  cfg = tiny_config(dtype="bfloat16")
  out, variables = run(cfg, random_ids(0, (2, 8)))
  assert out.last_hidden_state.dtype == jnp.bfloat16
  assert all(p.dtype == jnp.float32 for p in jax.tree.leaves(nn.meta.unbox(variables)))
  ref, _ = run(tiny_config(), random_ids(0, (2, 8)))
  error = np.abs(np.asarray(out.last_hidden_state, np.float32) - ref.last_hidden_state)
  # Measured (jax 0.10.2, CPU): max 0.023 and mean 0.0027 on states up to ~3 in size.
  assert error.max() < 0.04 and error.mean() < 0.005, (error.max(), error.mean())


@pytest.mark.parametrize("scan_layers", [False, True])
def test_every_kernel_carries_logical_axis_names(scan_layers):
  cfg = tiny_config(scan_layers=scan_layers, pooler_dense=True, pooling="attention",
                    position_embedding="relative")
  variables = Encoder(cfg).init(jax.random.key(0), random_ids(0, (1, 8)))
  boxed = jax.tree_util.tree_flatten_with_path(
      variables, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
  assert boxed and all(isinstance(b, nn.Partitioned) for _, b in boxed)
  known = {None, "vocab", "embed", "mlp", "heads", "kv", "layers"}
  stacked = 0
  for path, box in boxed:
    assert len(box.names) == box.value.ndim
    assert set(box.names) <= known
    # The stacked [N] axis leads and is named 'layers' exactly in the scanned stack's subtree.
    in_stack = "layers" in [k.key for k in path]
    assert box.names.count("layers") == int(in_stack), (path, box.names)
    assert (box.names[0] == "layers") == in_stack, (path, box.names)
    stacked += in_stack
  assert (stacked > 0) == scan_layers


@pytest.mark.mesh
def test_logical_sharding_under_a_mesh_gives_the_same_outputs():
  devices = np.array(jax.devices()[:8]).reshape(2, 2, 2)
  mesh = jax.sharding.Mesh(devices, ("data", "fsdp", "tensor"))
  rules = (("act_batch", "data"), ("act_len", None), ("act_embed", "tensor"),
           ("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("vocab", "tensor"))
  cfg = tiny_config()
  model = Encoder(cfg)
  ids = random_ids(0, (4, 8))
  variables = model.init(jax.random.key(0), ids)
  expected = model.apply(variables, ids).last_hidden_state
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    got = jax.jit(model.apply)(variables, ids).last_hidden_state
  np.testing.assert_allclose(got, expected, atol=1e-5)


# ------------------------------------------------------------------ bad inputs
@pytest.fixture(scope="module")
def text_model():
  cfg = tiny_config(max_len=16)
  model = Encoder(cfg)
  return model, model.init(jax.random.key(0), random_ids(0, (1, 8)))


@pytest.mark.parametrize("inputs, kwargs, message", [
    (np.ones((2, 3, 4), np.int32), {}, "input_ids must be an integer array [batch, length]"),
    (np.ones((2, 8), np.float32), {}, "dtype float32"),
    (np.ones((2, 8), np.int32), {"attention_mask": np.ones((2, 7))},
     "attention_mask has shape (2, 7) but the inputs need (2, 8)"),
    (np.ones((2, 8), np.int32), {"segment_ids": np.ones((1, 8), np.int32)}, "segment_ids has shape"),
    (np.ones((2, 8), np.int32), {"token_type_ids": np.full((2, 8), 2)},
     "token_type_ids[0, 0] = 2, outside [0, 2)"),
    (np.ones((1, 17), np.int32), {}, "sequence length 17 is longer than the position table (max_len=16)"),
    (np.full((1, 8), 97, np.int32), {},
     "input_ids[0, 0] = 97, outside [0, 97) (token ids must be < vocab_size)"),
    (np.array([[1, 2, -1, 3]], np.int32), {}, "input_ids[0, 2] = -1, outside"),
    (np.ones((2, 8), np.int32), {"output_positions": np.ones((1, 3), np.int32)},
     "output_positions must be [batch, M] = [2, M]; got shape (1, 3)"),
    (np.ones((2, 8), np.int32), {"output_positions": np.full((2, 3), 8, np.int32)},
     "output_positions[0, 0] = 8, outside [0, 8)"),
    (np.ones((2, 8), np.int32), {"output_positions": np.ones((2, 3), np.float32)},
     "output_positions must be integer indices"),
])
def test_bad_text_input_is_named(text_model, inputs, kwargs, message):
  model, variables = text_model
  with pytest.raises(ValueError) as err:
    model.apply(variables, inputs, **kwargs)
  assert message in str(err.value)


@pytest.mark.parametrize("check_ids", [False, True])
@pytest.mark.parametrize("bad_id", [97, 500, -1])
def test_out_of_vocabulary_ids_raise_eagerly_always_and_under_jit_when_checked(
    text_model, check_ids, bad_id):
  """EncoderConfig.check_ids: outside jit ids are always range-checked; under jit only
  with check_ids=True (a host callback that raises when the step runs)."""
  base, variables = text_model
  model = Encoder(base.cfg.replace(check_ids=check_ids))
  ids = np.array([[5, 7, bad_id, 1]], np.int32)
  message = rf"input_ids\[0, 2\] = {bad_id}, outside \[0, 97\)"
  with pytest.raises(ValueError, match=message):
    model.apply(variables, ids)
  jitted = jax.jit(model.apply)
  if check_ids:
    with pytest.raises(Exception, match=message):
      jax.block_until_ready(jitted(variables, ids))
  else:
    out = jax.block_until_ready(jitted(variables, ids))  # unchecked: no error
    if bad_id >= 97:  # the gather fills NaN: never another token's row, silently
      assert np.isnan(np.asarray(out.last_hidden_state)).any()


def test_checked_ids_under_jit_give_the_eager_values(text_model):
  model, variables = text_model
  checked = Encoder(model.cfg.replace(check_ids=True))
  good = np.array([[5, 7, 96, 0]], np.int32)
  np.testing.assert_allclose(jax.jit(checked.apply)(variables, good).pooled,
                             model.apply(variables, good).pooled, atol=1e-6)


def test_negative_ids_under_unchecked_jit_are_not_silently_another_tokens_row(text_model):
  model, variables = text_model
  out = jax.jit(model.apply)(variables, np.array([[5, 7, -1, 1]], np.int32))
  wrapped = jax.jit(model.apply)(variables, np.array([[5, 7, 96, 1]], np.int32))
  assert not np.allclose(out.last_hidden_state, wrapped.last_hidden_state, equal_nan=True)


@pytest.mark.parametrize("images, message", [
    (np.zeros((1, 30, 32, 3), np.float32), "image size (30, 32) is not divisible by patch_size=8"),
    (np.zeros((1, 32, 32, 1), np.float32), "images have 1 channels but num_channels=3"),
    (np.zeros((32, 32, 3), np.float32), "images must be a float array [batch, height, width, channels]"),
    (np.zeros((1, 40, 40, 3), np.float32), "differs from image_size=(32, 32)"),
])
def test_bad_image_input_is_named(images, message):
  cfg = tiny_config(input_kind="image", image_size=(32, 32), patch_size=8)
  model = Encoder(cfg)
  variables = model.init(jax.random.key(0), np.zeros((1, 32, 32, 3), np.float32))
  with pytest.raises(ValueError) as err:
    model.apply(variables, images)
  assert message in str(err.value)


def test_bad_series_input_is_named():
  cfg = tiny_config(input_kind="series", input_features=3)
  model = Encoder(cfg)
  variables = model.init(jax.random.key(0), np.zeros((1, 8, 3), np.float32))
  with pytest.raises(ValueError, match="series have 2 features but input_features=3"):
    model.apply(variables, np.zeros((1, 8, 2), np.float32))
  with pytest.raises(ValueError, match="sequence length 65 is longer"):
    model.apply(variables, np.zeros((1, 64, 3), np.float32))  # 64 + [CLS] > max_len
  with pytest.raises(ValueError, match="series must be a float array"):
    model.apply(variables, np.zeros((1, 8, 3), np.int32))
