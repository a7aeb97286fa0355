"""Task heads: tied MLM decoder, selected-position logits, classifiers, InfoNCE."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import jit_model, random_ids, tiny_config
from jaxencoder import (ContrastiveHead, EncoderForMaskedLM, SequenceClassificationHead,
                        TokenClassificationHead, cosine_similarity, info_nce_loss)


@pytest.fixture(scope="module")
def mlm():
  cfg = tiny_config()
  ids = random_ids(0, (2, 7))
  variables, apply = jit_model(cfg, ids, module=EncoderForMaskedLM)
  return cfg, ids, nn.meta.unbox(variables), apply


def test_mlm_decoder_is_tied_to_the_token_embedding(mlm):
  cfg, ids, variables, apply = mlm
  head = variables["params"]["mlm_head"]
  assert set(head) == {"transform", "norm", "bias"}  # no decoder kernel of its own
  table = variables["params"]["encoder"]["embeddings"]["token_embed"]["embedding"]
  logits, out = apply(variables, ids)
  with jax.numpy_rank_promotion("allow"):
    h = jax.nn.gelu(out.last_hidden_state @ head["transform"]["kernel"]
                    + head["transform"]["bias"], approximate=False)
    mean, var = h.mean(-1, keepdims=True), h.var(-1, keepdims=True)
    h = (h - mean) / jnp.sqrt(var + cfg.norm_eps) * head["norm"]["scale"] + head["norm"]["bias"]
    expected = h @ table.T + head["bias"]
  np.testing.assert_allclose(logits, expected, atol=1e-4)


def test_mlm_loss_gradient_reaches_the_embedding_through_the_decoder(mlm):
  _, ids, variables, apply = mlm
  absent = next(t for t in range(97) if t not in np.asarray(ids))  # never an input token
  def logit_of_absent(table):
    p = jax.tree.map(lambda x: x, variables)
    p["params"]["encoder"]["embeddings"]["token_embed"]["embedding"] = table
    logits, _ = apply(p, ids)
    return logits[0, 0, absent]
  table = variables["params"]["encoder"]["embeddings"]["token_embed"]["embedding"]
  grad = jax.grad(logit_of_absent)(table)
  assert float(jnp.abs(grad[absent]).sum()) > 0  # reached only through the tied decoder


def test_mlm_logits_at_selected_positions_equal_full_logits(mlm):
  _, ids, variables, apply = mlm
  full, _ = apply(variables, ids)
  positions = jnp.array([[1, 4], [0, 6]])
  picked, _ = apply(variables, ids, masked_positions=positions)
  assert picked.shape == (2, 2, 97)
  np.testing.assert_allclose(picked, jnp.take_along_axis(full, positions[..., None], 1), atol=1e-5)


def test_classification_heads_shapes():
  cfg = tiny_config()
  seq = SequenceClassificationHead(cfg, num_classes=3)
  tok = TokenClassificationHead(cfg, num_classes=5)
  pooled, hidden = jnp.ones((4, 32)), jnp.ones((4, 9, 32))
  assert seq.apply(seq.init(jax.random.key(0), pooled), pooled).shape == (4, 3)
  assert tok.apply(tok.init(jax.random.key(0), hidden), hidden).shape == (4, 9, 5)


def test_contrastive_head_returns_unit_vectors():
  head = ContrastiveHead(tiny_config(), projection_dim=16)
  pooled = jax.random.normal(jax.random.key(0), (3, 32))
  z = head.apply(head.init(jax.random.key(1), pooled), pooled)
  assert z.shape == (3, 16)
  np.testing.assert_allclose(jnp.linalg.norm(z, axis=-1), 1.0, rtol=1e-5)


def test_info_nce_equals_hand_computed_value():
  a = jnp.array([[1.0, 0.0], [0.0, 2.0]])
  b = jnp.array([[3.0, 0.0], [1.0, 1.0]])
  t = 0.5
  # Cosines: a0.b0 = 1, a0.b1 = 1/sqrt2, a1.b0 = 0, a1.b1 = 1/sqrt2.
  c = 1 / np.sqrt(2)
  row0 = -np.log(np.exp(1 / t) / (np.exp(1 / t) + np.exp(c / t)))
  row1 = -np.log(np.exp(c / t) / (np.exp(0 / t) + np.exp(c / t)))
  col0 = -np.log(np.exp(1 / t) / (np.exp(1 / t) + np.exp(0 / t)))
  col1 = -np.log(np.exp(c / t) / (np.exp(c / t) + np.exp(c / t)))
  assert float(info_nce_loss(a, b, t, symmetric=False)) == pytest.approx((row0 + row1) / 2, rel=1e-5)
  expected = ((row0 + row1) / 2 + (col0 + col1) / 2) / 2
  assert float(info_nce_loss(a, b, t)) == pytest.approx(expected, rel=1e-5)


def test_cosine_similarity():
  a = jnp.array([[1.0, 0.0], [1.0, 1.0]])
  b = jnp.array([[2.0, 0.0], [-1.0, -1.0]])
  np.testing.assert_allclose(cosine_similarity(a, b), [1.0, -1.0], rtol=1e-6)
