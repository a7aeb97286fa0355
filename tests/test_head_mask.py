"""The head mask (`Encoder(..., head_mask=[N, H])`): zeroing a head's output before the
output projection, in every layout and attention implementation, checked against the
same model with that head's rows of the output projection zeroed."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_ids, tiny_config
from jaxencoder import EncoderForMaskedLM
from jaxencoder.model.encoder import SCANNED_LAYERS, Encoder, layer_name

IDS = random_ids(0, (2, 12))
MASK = jnp.array([[1] * 12, [1] * 7 + [0] * 5])


def init(cfg):
  return nn.meta.unbox(Encoder(cfg).init(jax.random.key(1), IDS, MASK))["params"]


def attention_params(params, cfg, layer):
  """(the layer's attention params, a function putting a changed copy back)."""
  if cfg.scan_layers:
    return (jax.tree.map(lambda x: x[layer], params[SCANNED_LAYERS]["attention"]),
            lambda new: {**params, SCANNED_LAYERS: {**params[SCANNED_LAYERS], "attention":
                jax.tree.map(lambda x, y: x.at[layer].set(y),
                             params[SCANNED_LAYERS]["attention"], new)}})
  name = layer_name(layer)
  return (params[name]["attention"],
          lambda new: {**params, name: {**params[name], "attention": new}})


def without_heads(params, cfg, layer, heads):
  """`params` with the output projection's rows of `heads` in `layer` zeroed: what those
  heads' outputs contribute is gone, the projection's bias stays."""
  attention, put = attention_params(params, cfg, layer)
  kernel_HxKxD = attention["out"]["kernel"].at[jnp.array(heads)].set(0.0)
  return put({**attention, "out": {**attention["out"], "kernel": kernel_HxKxD}})


@pytest.mark.parametrize("impl", ["xla", "fused", "splash"])
@pytest.mark.parametrize("scan", [False, True])
def test_masking_a_head_equals_zeroing_its_rows_of_the_output_projection(impl, scan):
  cfg = tiny_config(scan_layers=scan, attention_impl=impl)
  params = init(cfg)
  model = Encoder(cfg)
  head_mask = np.ones((2, 4), np.float32)
  head_mask[1, 2] = head_mask[0, 0] = 0.0
  masked = model.apply({"params": params}, IDS, MASK, head_mask=head_mask)
  cut = without_heads(without_heads(params, cfg, 1, [2]), cfg, 0, [0])
  reference = model.apply({"params": cut}, IDS, MASK)
  real = MASK[..., None].astype(bool)
  np.testing.assert_allclose(np.where(real, masked.last_hidden_state, 0),
                             np.where(real, reference.last_hidden_state, 0), atol=1e-5)
  unmasked = model.apply({"params": params}, IDS, MASK)
  assert not np.allclose(masked.last_hidden_state, unmasked.last_hidden_state, atol=1e-3)


@pytest.mark.parametrize("scan", [False, True])
def test_masking_every_head_of_a_layer_leaves_the_residual_and_the_projection_bias(scan):
  cfg = tiny_config(scan_layers=scan)
  params = init(cfg)
  model = Encoder(cfg)
  head_mask = np.ones((2, 4), np.float32)
  head_mask[0] = 0.0
  masked = model.apply({"params": params}, IDS, MASK, head_mask=head_mask,
                       output_hidden_states=True)
  # Layer 0 (post-norm): attention_norm(x + out_bias), then its feed-forward, as if the
  # attention sublayer's output were its bias alone: the same as a zero output kernel.
  reference = model.apply({"params": without_heads(params, cfg, 0, [0, 1, 2, 3])}, IDS, MASK,
                          output_hidden_states=True)
  for got, want in zip(masked.hidden_states, reference.hidden_states):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_an_all_ones_mask_gives_the_outputs_without_one_bit_exactly():
  cfg = tiny_config()
  params = init(cfg)
  model = Encoder(cfg)
  ones = model.apply({"params": params}, IDS, MASK, head_mask=jnp.ones((2, 4)))
  plain = model.apply({"params": params}, IDS, MASK)
  np.testing.assert_array_equal(ones.last_hidden_state, plain.last_hidden_state)


def test_a_masked_head_gets_no_gradient_through_its_projections():
  cfg = tiny_config()
  params = init(cfg)
  model = Encoder(cfg)
  head_mask = jnp.ones((2, 4)).at[1, 3].set(0.0)

  def loss(p):
    return jnp.sum(model.apply({"params": p}, IDS, MASK, head_mask=head_mask).pooled ** 2)

  grads = jax.grad(loss)(params)[layer_name(1)]["attention"]
  for name in ("query", "key", "value"):
    kernel_DxHxK = np.asarray(grads[name]["kernel"])
    assert np.all(kernel_DxHxK[:, 3] == 0), name
    assert np.abs(kernel_DxHxK[:, :3]).sum() > 0, name
  assert np.all(np.asarray(grads["out"]["kernel"])[3] == 0)


def test_the_mlm_model_passes_its_head_mask_to_the_encoder():
  cfg = tiny_config()
  model = EncoderForMaskedLM(cfg)
  variables = model.init(jax.random.key(1), IDS, MASK)
  zero = jnp.zeros((2, 4))
  masked, _ = model.apply(variables, IDS, MASK, head_mask=zero)
  plain, _ = model.apply(variables, IDS, MASK)
  assert not np.allclose(masked, plain, atol=1e-3)


def test_a_head_mask_of_the_wrong_shape_names_the_shape_it_needs():
  cfg = tiny_config()
  params = init(cfg)
  with pytest.raises(ValueError, match=r"head_mask has shape \(4, 2\), expected "
                                       r"\[num_layers, num_heads\] = \[2, 4\]"):
    Encoder(cfg).apply({"params": params}, IDS, MASK, head_mask=jnp.ones((4, 2)))
