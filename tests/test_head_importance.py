"""Head importance (jaxencoder.probing.head_importance): masking, the gradient estimate and the
pruning curve, on a loss whose answer is known and on a tiny encoder."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import random_ids, tiny_config
from jaxencoder.model.encoder import Encoder
from jaxencoder.probing import head_importance

WEIGHTS_NxH = np.array([[0.5, 0.1, 2.0], [0.0, 1.5, 0.3]])


def linear_loss(mask_NxH):
  """Dropping head (n, h) costs WEIGHTS_NxH[n, h]; the full model's loss is 1."""
  return 1.0 + float(np.sum(WEIGHTS_NxH * (1 - mask_NxH)))


def test_masking_importance_is_each_heads_own_cost():
  importance, base = head_importance.masking_importance(linear_loss, 2, 3, progress=False)
  assert base == 1.0
  np.testing.assert_allclose(importance, WEIGHTS_NxH)


def test_pruning_goes_from_least_to_most_important():
  assert head_importance.pruning_order(WEIGHTS_NxH) == [(1, 0), (0, 1), (1, 2), (0, 0), (1, 1),
                                                         (0, 2)]
  curve = head_importance.pruning_curve(linear_loss, WEIGHTS_NxH, points=6, progress=False)
  assert [p["pruned"] for p in curve] == [0, 1, 2, 3, 4, 5]
  np.testing.assert_allclose([p["loss"] for p in curve],
                             1.0 + np.cumsum([0, 0.0, 0.1, 0.3, 0.5, 1.5]))


def test_gradient_importance_is_the_mean_absolute_gradient():
  grads = [np.array([[1.0, -2.0]]), np.array([[-3.0, 0.0]])]
  np.testing.assert_allclose(head_importance.gradient_importance(grads), [[2.0, 1.0]])
  with pytest.raises(ValueError, match="at least one batch"):
    head_importance.gradient_importance([])


def test_on_an_encoder_masking_importance_is_the_loss_change_of_dropping_that_head():
  cfg = tiny_config()
  ids, mask = random_ids(0, (4, 10)), jnp.ones((4, 10), jnp.int32)
  model = Encoder(cfg)
  params = nn.meta.unbox(model.init(jax.random.key(0), ids, mask))["params"]
  target_BxD = jax.random.normal(jax.random.key(1), (4, cfg.emb_dim))

  @jax.jit
  def loss_fn(head_mask_NxH):
    pooled = model.apply({"params": params}, ids, mask, head_mask=head_mask_NxH).pooled
    return jnp.mean((pooled - target_BxD) ** 2)

  importance, base = head_importance.masking_importance(lambda m: float(loss_fn(m)), 2, 4,
                                                        progress=False)
  dropped = np.ones((2, 4), np.float32)
  dropped[1, 2] = 0
  assert importance[1, 2] == pytest.approx(float(loss_fn(dropped)) - base, abs=1e-7)
  assert np.all(importance != 0)  # every head changes this loss
  grad = np.asarray(jax.grad(loss_fn)(jnp.ones((2, 4))))
  np.testing.assert_allclose(head_importance.gradient_importance([grad]), np.abs(grad))
