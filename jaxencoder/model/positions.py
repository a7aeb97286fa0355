"""Position information: sinusoidal tables, RoPE, T5 relative buckets, packed positions,
and learned tables resampled to a new length or patch grid."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.layers import dtype_of


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


def apply_rope(x_BxLxHxK: jax.Array, positions_BxL: jax.Array, base: float,
               scaling: float = 1.0) -> jax.Array:
  """Rotates feature pairs (k, k + K/2) by angle (position / scaling) * base^(-2k/K).

  `scaling` > 1 is linear position interpolation (Chen et al. 2023): a model trained on
  L positions reads scaling * L, each at the angle of position / scaling.
  """
  head_dim = x_BxLxHxK.shape[-1]
  inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)
  positions_BxL = positions_BxL.astype(jnp.float32)
  if scaling != 1.0:
    positions_BxL = positions_BxL / scaling
  angles_BxLx1xK2 = positions_BxL[:, :, None, None] * inv_freq.reshape(1, 1, 1, -1)
  sin, cos = jnp.sin(angles_BxLx1xK2), jnp.cos(angles_BxLx1xK2)
  x1, x2 = jnp.split(x_BxLxHxK.astype(jnp.float32), 2, axis=-1)
  rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return rotated.astype(x_BxLxHxK.dtype)


# ------------------------------------------------------------------ resampling tables
RESAMPLE_METHODS = ("linear", "cubic")
GRID_METHODS = {"bilinear": "linear", "bicubic": "cubic"}  # the same, per axis


def interpolation_matrix(new_len: int, old_len: int, method: str, *,
                         align_corners: bool) -> np.ndarray:
  """[new_len, old_len] weights that resample a 1-D signal, as torch's interpolate.

  align_corners=False samples at half-pixel centres, src = (i + 0.5) * old/new - 0.5
  (linear clamps src < 0 to 0); True maps the end rows onto each other,
  src = i * (old - 1)/(new - 1). "cubic" is Keys' kernel with a = -0.75 (torch's, not
  jax.image's -0.5) over 4 taps, indices clamped to the edge. No antialiasing: shrinking
  samples, it does not average (torch's default antialias=False).
  """
  if method not in RESAMPLE_METHODS:
    raise ValueError(f"method={method!r} is not one of {RESAMPLE_METHODS}")
  if new_len < 1 or old_len < 1:
    raise ValueError(f"cannot resample {old_len} rows to {new_len}")
  dst = np.arange(new_len, dtype=np.float64)
  if align_corners:
    src = dst * ((old_len - 1) / (new_len - 1) if new_len > 1 else 0.0)
  else:
    src = (dst + 0.5) * (old_len / new_len) - 0.5
    if method == "linear":
      src = np.maximum(src, 0.0)
  start = np.floor(src)
  t = src - start
  if method == "linear":
    taps, weights = (start, start + 1), (1 - t, t)
  else:
    a = -0.75
    near = lambda x: ((a + 2) * x - (a + 3)) * x * x + 1  # |x| <= 1
    far = lambda x: ((a * x - 5 * a) * x + 8 * a) * x - 4 * a  # 1 < |x| < 2
    taps = (start - 1, start, start + 1, start + 2)
    weights = (far(t + 1), near(t), near(1 - t), far(2 - t))
  matrix = np.zeros((new_len, old_len))
  for tap, weight in zip(taps, weights):
    np.add.at(matrix, (np.arange(new_len), np.clip(tap, 0, old_len - 1).astype(int)), weight)
  return matrix


def resample_position_table(table_NxD: jax.Array, new_len: int,
                            method: str = "linear") -> jax.Array:
  """A learned 1-D position table stretched (or shrunk) to `new_len` rows by interpolation.

  Row 0 and row N-1 land on rows 0 and new_len-1 (align_corners=True); row i of the
  result reads the old table at i * (N-1)/(new_len-1). A model then sees each position
  about where it saw the position scaled into its trained range.
  """
  weights_MxN = interpolation_matrix(new_len, table_NxD.shape[0], method, align_corners=True)
  return _apply_weights("mn,nd->md", table_NxD.dtype, weights_MxN, table_NxD)


def resample_position_grid(table: jax.Array, old_grid: tuple[int, int],
                           new_grid: tuple[int, int], method: str = "bicubic") -> jax.Array:
  """A ViT position table resampled from an old patch grid to a new one.

  `table` is [1+N, D] or [1, 1+N, D] (a leading [CLS] row, kept as is) or [N, D] / [1, N, D]
  (no [CLS]), N = h * w patches row-major. The grid is resized separably, each axis as
  `interpolation_matrix` with half-pixel centres: "bicubic" reproduces
  transformers' ViT `interpolate_pos_encoding` (torch bicubic, align_corners=False,
  no antialias). Returns the same rank as given.
  """
  (old_h, old_w), (new_h, new_w) = old_grid, new_grid
  table_TxD = table.reshape(table.shape[-2:])
  num_cls = table_TxD.shape[0] - old_h * old_w
  if num_cls not in (0, 1):
    raise ValueError(f"position table has {table_TxD.shape[0]} rows; a {old_h}x{old_w} grid "
                     f"needs {old_h * old_w} (+1 for [CLS])")
  grid_HxWxD = table_TxD[num_cls:].reshape(old_h, old_w, -1)
  if method not in GRID_METHODS:
    raise ValueError(f"method={method!r} is not one of {tuple(GRID_METHODS)}")
  rows_hxH = interpolation_matrix(new_h, old_h, GRID_METHODS[method], align_corners=False)
  cols_wxW = interpolation_matrix(new_w, old_w, GRID_METHODS[method], align_corners=False)
  grid_hxwxD = _apply_weights("hH,HWd,wW->hwd", table.dtype, rows_hxH, grid_HxWxD, cols_wxW)
  out_TxD = jnp.concatenate([table_TxD[:num_cls], grid_hxwxD.reshape(new_h * new_w, -1)])
  return out_TxD.reshape(table.shape[:-2] + out_TxD.shape)


def _apply_weights(spec: str, dtype, *operands) -> jax.Array:
  """einsum in float32 at full precision (TPUs default to bf16 passes), cast to `dtype`."""
  out = jnp.einsum(spec, *(jnp.asarray(x, jnp.float32) for x in operands),
                   precision=jax.lax.Precision.HIGHEST)
  return out.astype(dtype)


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
