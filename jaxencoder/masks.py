"""Attention masks: padding, packed segments, causal and sliding-window."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def make_attention_mask(attention_mask_BxL: jax.Array,
                           segment_ids_BxL: jax.Array | None = None, *,
                           causal: bool = False,
                           sliding_window: int | None = None) -> jax.Array:
  """Boolean [B, 1, L, L] mask: True where query i may attend to key j.

  Keys must be real tokens (padding); with segment ids, queries see only keys of
  their own segment; `causal` hides the future; `sliding_window` w keeps |i-j| <= w.
  """
  seq_len = attention_mask_BxL.shape[1]
  mask_BxLxL = jnp.broadcast_to(attention_mask_BxL[:, None, :].astype(bool),
                                (attention_mask_BxL.shape[0], seq_len, seq_len))
  if segment_ids_BxL is not None:
    mask_BxLxL &= segment_ids_BxL[:, :, None] == segment_ids_BxL[:, None, :]
  query_1xLx1 = jnp.arange(seq_len)[None, :, None]
  key_1x1xL = jnp.arange(seq_len)[None, None, :]
  if causal:
    mask_BxLxL &= key_1x1xL <= query_1xLx1
  if sliding_window is not None:
    mask_BxLxL &= jnp.abs(query_1xLx1 - key_1x1xL) <= sliding_window
  return mask_BxLxL[:, None, :, :]
