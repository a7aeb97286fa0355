"""Position information: sinusoidal tables, RoPE, T5 relative buckets, packed positions."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxencoder.config import EncoderConfig
from jaxencoder.layers import dtype_of


def positions_from_segments(segment_ids_BxL: jax.Array) -> jax.Array:
  """Positions that restart at 0 where the segment id changes (packed rows)."""
  _, seq_len = segment_ids_BxL.shape
  index_1xL = jnp.arange(seq_len, dtype=jnp.int32)[None, :]
  starts_BxL = jnp.concatenate(
      [jnp.ones_like(segment_ids_BxL[:, :1], dtype=bool),
       segment_ids_BxL[:, 1:] != segment_ids_BxL[:, :-1]], axis=1)
  start_index_BxL = jax.lax.cummax(jnp.where(starts_BxL, index_1xL, 0), axis=1)
  return index_1xL - start_index_BxL


def sinusoidal(positions: jax.Array, dim: int, base: float = 10_000.0) -> jax.Array:
  """Transformer sinusoids: [..., dim] with sin on even and cos on odd features.

  PE[p, 2i] = sin(p / base^(2i/dim)), PE[p, 2i+1] = cos(p / base^(2i/dim)).
  Defined for any position, so it extends past the trained length.
  """
  inv_freq = base ** (-np.arange(0, dim, 2, dtype=np.float32) / dim)  # [dim/2]
  angles = positions[..., None].astype(jnp.float32) * inv_freq.reshape((1,) * positions.ndim + (-1,))
  out = jnp.stack([jnp.sin(angles), jnp.cos(angles)], axis=-1)  # [..., dim/2, 2]
  return out.reshape(*positions.shape, -1)[..., :dim]


def sinusoidal_2d(grid_h: int, grid_w: int, dim: int) -> jax.Array:
  """2-D sinusoids for a patch grid: half the features for rows, half for columns."""
  if dim % 2:
    raise ValueError(f"emb_dim={dim} must be even for 2-D sinusoidal positions")
  rows_HxW, cols_HxW = jnp.meshgrid(jnp.arange(grid_h), jnp.arange(grid_w), indexing="ij")
  emb_HxWxD = jnp.concatenate(
      [sinusoidal(rows_HxW, dim // 2), sinusoidal(cols_HxW, dim // 2)], axis=-1)
  return emb_HxWxD.reshape(grid_h * grid_w, dim)


def apply_rope(x_BxLxHxK: jax.Array, positions_BxL: jax.Array, base: float) -> jax.Array:
  """Rotates feature pairs (k, k + K/2) by angle position * base^(-2k/K)."""
  head_dim = x_BxLxHxK.shape[-1]
  inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
  angles_BxLx1xK2 = (positions_BxL[:, :, None, None].astype(jnp.float32)
                     * inv_freq.reshape(1, 1, 1, -1))
  sin, cos = jnp.sin(angles_BxLx1xK2), jnp.cos(angles_BxLx1xK2)
  x1, x2 = jnp.split(x_BxLxHxK.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x_BxLxHxK.dtype)


def relative_bucket(relative_position: jax.Array, num_buckets: int,
                    max_distance: int) -> jax.Array:
  """T5's bidirectional bucketing of (key - query) offsets.

  Half the buckets per direction; within each, exact buckets for small offsets
  and logarithmic ones up to `max_distance`.
  """
  half = num_buckets // 2
  bucket = jnp.where(relative_position > 0, half, 0)
  distance = jnp.abs(relative_position)
  max_exact = half // 2
  log_ratio = (jnp.log(jnp.maximum(distance, 1) / max_exact)
               / np.log(max_distance / max_exact))
  log_bucket = max_exact + (log_ratio * (half - max_exact)).astype(jnp.int32)
  log_bucket = jnp.minimum(log_bucket, half - 1)
  return bucket + jnp.where(distance < max_exact, distance, log_bucket)


class RelativePositionBias(nn.Module):
  """Learned per-head bias from bucketed relative positions, shared by all layers."""
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, positions_BxL: jax.Array, key_positions_BxS: jax.Array | None = None
               ) -> jax.Array:
    """Bias [B, H, L, S] of queries at `positions_BxL` over keys at `key_positions_BxS`
    (default: the same positions, S = L)."""
    cfg = self.cfg
    if key_positions_BxS is None:
      key_positions_BxS = positions_BxL
    table_RxH = self.param(
        "embedding",
        nn.with_logical_partitioning(
            nn.initializers.normal(cfg.initializer_range), (None, "heads")),
        (cfg.relative_num_buckets, cfg.num_heads), dtype_of(cfg.param_dtype))
    offset_BxLxS = key_positions_BxS[:, None, :] - positions_BxL[:, :, None]
    bucket_BxLxS = relative_bucket(offset_BxLxS, cfg.relative_num_buckets,
                                   cfg.relative_max_distance)
    bias_BxLxSxH = jnp.asarray(table_RxH, jnp.float32)[bucket_BxLxS]
    return jnp.transpose(bias_BxLxSxH, (0, 3, 1, 2))  # [B, H, L, S]
