"""Attention masks: padding, packed segments, causal and sliding-window; a decoding cache's."""

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


def make_cache_mask(written_BxS: jax.Array, positions_BxT: jax.Array, *,
                    sliding_window: int | None = None) -> jax.Array:
  """Boolean [B, 1, T, S] mask of T decoding queries over a key / value cache of S rows.

  Key j is visible from a query at position p when row j has been written and j <= p
  (causal; rows are positions); `sliding_window` w also keeps p - j <= w.
  """
  key_1x1xS = jnp.arange(written_BxS.shape[1])[None, None, :]
  query_BxTx1 = positions_BxT[:, :, None]
  mask_BxTxS = written_BxS[:, None, :].astype(bool) & (key_1x1xS <= query_BxTx1)
  if sliding_window is not None:
    mask_BxTxS &= query_BxTx1 - key_1x1xS <= sliding_window
  return mask_BxTxS[:, None, :, :]
