"""Pooling a [B, L, D] sequence into one [B, D] vector per example."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.layers import dense, kernel_init, dtype_of


def mean_pool(x_BxLxD: jax.Array, mask_BxL: jax.Array) -> jax.Array:
  """Mean over real tokens (as sentence-transformers)."""
  weights_BxLx1 = mask_BxL[..., None].astype(jnp.float32)
  total_BxD = jnp.sum(x_BxLxD.astype(jnp.float32) * weights_BxLx1, axis=1)
  return (total_BxD / jnp.maximum(weights_BxLx1.sum(axis=1), 1e-9)).astype(x_BxLxD.dtype)


def max_pool(x_BxLxD: jax.Array, mask_BxL: jax.Array) -> jax.Array:
  """Feature-wise max over real tokens; zeros for a row without any (a batch's fill rows,
  whose finfo.min would overflow the head to inf and NaN)."""
  real_BxLx1 = mask_BxL[..., None].astype(bool)
  masked = jnp.where(real_BxLx1, x_BxLxD, jnp.finfo(x_BxLxD.dtype).min)
  return jnp.where(real_BxLx1.any(axis=1), masked.max(axis=1), 0).astype(x_BxLxD.dtype)


class AttentionPool(nn.Module):
  """One learned query attends over the real tokens: softmax(k(x) . q) weighted sum."""
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxD, mask_BxL):
    cfg = self.cfg
    query_D = self.param("query", kernel_init(cfg, ("embed",)), (cfg.emb_dim,),
                         dtype_of(cfg.param_dtype))
    keys_BxLxD = dense(cfg, cfg.emb_dim, kernel_axes=("embed", None), name="key")(x_BxLxD)
    logits_BxL = jnp.einsum("bld,d->bl", keys_BxLxD, query_D.astype(keys_BxLxD.dtype),
                            preferred_element_type=jnp.float32) * cfg.emb_dim ** -0.5
    logits_BxL = jnp.where(mask_BxL.astype(bool), logits_BxL, jnp.finfo(jnp.float32).min)
    weights_BxL = jax.nn.softmax(logits_BxL, axis=-1).astype(x_BxLxD.dtype)
    return jnp.einsum("bl,bld->bd", weights_BxL, x_BxLxD)


class Pooler(nn.Module):
  """cls / mean / max / attention pooling, optionally followed by BERT's dense + tanh."""
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxD, mask_BxL):
    kind = self.cfg.pooling
    if kind == "cls":
      pooled_BxD = x_BxLxD[:, 0]
    elif kind == "mean":
      pooled_BxD = mean_pool(x_BxLxD, mask_BxL)
    elif kind == "max":
      pooled_BxD = max_pool(x_BxLxD, mask_BxL)
    else:
      pooled_BxD = AttentionPool(self.cfg, name="attention")(x_BxLxD, mask_BxL)
    if self.cfg.pooler_dense:
      dense_layer = dense(self.cfg, self.cfg.emb_dim, kernel_axes=("embed", None), name="dense")
      pooled_BxD = jnp.tanh(dense_layer(pooled_BxD))
    return pooled_BxD
