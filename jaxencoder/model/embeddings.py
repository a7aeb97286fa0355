"""Front ends (token ids, image patches, continuous series) and the embedding sum."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.layers import dense, dtype_of, kernel_init, norm
from jaxencoder.model.positions import positions_from_segments, sinusoidal, sinusoidal_2d


def patchify(images_BxHxWxC: jax.Array, patch: int) -> jax.Array:
  """Non-overlapping patches, row-major: [B, H, W, C] -> [B, P, patch*patch*C]."""
  b, h, w, c = images_BxHxWxC.shape
  x = images_BxHxWxC.reshape(b, h // patch, patch, w // patch, patch, c)
  x = x.transpose(0, 1, 3, 2, 4, 5)  # [B, gh, gw, p, p, C]
  return x.reshape(b, (h // patch) * (w // patch), patch * patch * c)


def _embed(cfg: EncoderConfig, num: int, axes, name: str) -> nn.Embed:
  """A lookup table that gathers in `param_dtype`; callers cast to the compute dtype.

  Gathering from a bf16 copy makes the backward a bf16 scatter-add, which GPUs run as
  compare-and-swap loops: with every row hitting the same few position / type rows it
  cost ~95% of a bf16 train step on an H200 (docs/performance.md). Same values forward.
  """
  return nn.Embed(num, cfg.embedding_dim or cfg.emb_dim, dtype=dtype_of(cfg.param_dtype),
                  param_dtype=dtype_of(cfg.param_dtype),
                  embedding_init=kernel_init(cfg, axes), name=name)


class Embeddings(nn.Module):
  """Maps raw inputs to [B, L, D] vectors: front end + [CLS] + positions + types.

  Returns (x_BxLxD, attention_mask_BxL, segment_ids_BxL | None, positions_BxL);
  image and series inputs gain a leading [CLS] vector (and a mask entry) when
  configured. Positions default to 0..L-1, restarting per segment when packed.
  `token_table_VxD` (text): embed with this table, owned by another module (an
  encoder-decoder's decoder shares its encoder's), instead of a `token_embed` of its own.
  """
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, inputs, attention_mask_BxL, token_type_ids_BxL, segment_ids_BxL,
               positions_BxL, *, deterministic: bool, token_table_VxD=None):
    cfg = self.cfg
    grid = None
    if cfg.input_kind == "text":
      # An out-of-range id reads NaN (take's fill), never another token's row: a negative
      # id would otherwise wrap to row V + id.
      inputs = jnp.where(inputs < 0, jnp.iinfo(jnp.int32).max, inputs)
      if token_table_VxD is None:
        x_BxLxD = _embed(cfg, cfg.vocab_size, ("vocab", "embed"), "token_embed")(inputs)
      else:
        x_BxLxD = jnp.take(token_table_VxD, inputs, axis=0)
      x_BxLxD = x_BxLxD.astype(dtype_of(cfg.dtype))
      if cfg.scale_embeddings:
        x_BxLxD *= jnp.sqrt(cfg.emb_dim).astype(x_BxLxD.dtype)
    else:
      if cfg.input_kind == "image":
        grid = (inputs.shape[1] // cfg.image_stride, inputs.shape[2] // cfg.image_stride)
        inputs = patchify(self._stem(inputs), cfg.patch_size)
      name = "patch_embed" if cfg.input_kind == "image" else "series_embed"
      x_BxLxD = dense(cfg, cfg.emb_dim, kernel_axes=(None, "embed"), name=name)(
          inputs.astype(dtype_of(cfg.dtype)))
      if cfg.use_cls_token:
        x_BxLxD, attention_mask_BxL, segment_ids_BxL = self._prepend_cls(
            x_BxLxD, attention_mask_BxL, segment_ids_BxL)
    if positions_BxL is None:
      positions_BxL = default_positions(x_BxLxD.shape[:2], segment_ids_BxL)
    x_BxLxD = x_BxLxD + self._position_embedding(positions_BxL, grid).astype(x_BxLxD.dtype)
    if cfg.type_vocab_size and (token_type_ids_BxL is not None or cfg.input_kind == "text"):
      if token_type_ids_BxL is None:  # BERT adds type 0 when no type ids are given
        token_type_ids_BxL = jnp.zeros(x_BxLxD.shape[:2], jnp.int32)
      type_embed = _embed(cfg, cfg.type_vocab_size, (None, "embed"), "type_embed")
      x_BxLxD += type_embed(token_type_ids_BxL).astype(x_BxLxD.dtype)
    if cfg.embedding_norm:
      x_BxLxD = norm(cfg, name="norm")(x_BxLxD)
    x_BxLxD = nn.Dropout(cfg.dropout_rate)(x_BxLxD, deterministic=deterministic)
    if cfg.embedding_dim is not None:  # ELECTRA: E-wide tables, projected to D
      x_BxLxD = dense(cfg, cfg.emb_dim, kernel_axes=(None, "embed"), name="project")(x_BxLxD)
    return x_BxLxD, attention_mask_BxL, segment_ids_BxL, positions_BxL

  def _stem(self, images_BxHxWxC):
    """The convolutional stem (cfg.stem_channels): [B, H, W, C] -> [B, H / s^n, W / s^n,
    C_last] for n convolutions of stride s."""
    cfg = self.cfg
    x = images_BxHxWxC.astype(dtype_of(cfg.dtype))
    he_init = nn.initializers.variance_scaling(2.0, "fan_in", "truncated_normal")
    for i, channels in enumerate(cfg.stem_channels):
      x = nn.Conv(channels, (3, 3), strides=cfg.stem_stride, padding="SAME", dtype=dtype_of(cfg.dtype),
                  param_dtype=dtype_of(cfg.param_dtype),
                  kernel_init=nn.with_logical_partitioning(he_init, (None, None, None, None)),
                  bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)),
                  name=f"stem_{i}")(x)
      x = nn.gelu(x)
    return x

  def _prepend_cls(self, x_BxLxD, attention_mask_BxL, segment_ids_BxL):
    cls_D = self.param("cls_token", kernel_init(self.cfg, ("embed",)), (self.cfg.emb_dim,),
                       dtype_of(self.cfg.param_dtype))
    cls_Bx1xD = jnp.broadcast_to(cls_D.astype(x_BxLxD.dtype), (x_BxLxD.shape[0], 1, x_BxLxD.shape[2]))
    ones_Bx1 = jnp.ones((x_BxLxD.shape[0], 1), attention_mask_BxL.dtype)
    if segment_ids_BxL is not None:  # [CLS] joins the first segment
      segment_ids_BxL = jnp.concatenate([segment_ids_BxL[:, :1], segment_ids_BxL], axis=1)
    return (jnp.concatenate([cls_Bx1xD, x_BxLxD], axis=1),
            jnp.concatenate([ones_Bx1, attention_mask_BxL], axis=1), segment_ids_BxL)

  def _position_embedding(self, positions_BxL, grid):
    """Absolute position vectors [B, L, D] (zeros for relative, RoPE and none)."""
    cfg = self.cfg
    kind = cfg.position_embedding
    if kind == "learned":
      table = _embed(cfg, num_positions(cfg), (None, "embed"), "position_embed")
      return table(positions_BxL + cfg.position_offset)
    if kind == "sinusoidal" and cfg.input_kind == "image":
      table_PxD = sinusoidal_2d(*grid, cfg.emb_dim)
      if cfg.use_cls_token:  # [CLS] gets no position
        table_PxD = jnp.concatenate([jnp.zeros((1, cfg.emb_dim)), table_PxD])
      return table_PxD[None]
    if kind == "sinusoidal":
      return sinusoidal(positions_BxL, cfg.embedding_dim or cfg.emb_dim)
    return jnp.zeros((), jnp.float32)


def num_positions(cfg: EncoderConfig) -> int:
  """Rows of the learned position table: max_len, or the patch count (+ [CLS])."""
  if cfg.input_kind == "image":
    grid_h, grid_w = cfg.patch_grid
    return grid_h * grid_w + int(cfg.use_cls_token)
  return cfg.max_len


def default_positions(shape_BxL: tuple[int, int], segment_ids_BxL: jax.Array | None) -> jax.Array:
  """0..L-1 per row, or per segment for packed rows."""
  if segment_ids_BxL is not None:
    return positions_from_segments(segment_ids_BxL)
  return jnp.broadcast_to(jnp.arange(shape_BxL[1], dtype=jnp.int32), shape_BxL)
