"""A loaded checkpoint's learned position table resized: longer text, another image size.

  cfg, params = resize_positions(cfg, params, max_len=1024)        # text: 1-D, linear
  cfg, params = resize_positions(cfg, params, image_size=(384, 384))  # ViT: 2-D, bicubic

Interpolated rows are a starting point for fine-tuning, not trained values, so each
resize logs a warning. Without it, inputs longer than the table stay an error.
"""

from __future__ import annotations

import logging
from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.embeddings import num_positions
from jaxencoder.model.encoder import EMBEDDINGS, ENCODER
from jaxencoder.model.positions import resample_position_grid, resample_position_table

log = logging.getLogger(__name__)
POSITION_TABLE = (EMBEDDINGS, "position_embed", "embedding")  # inside the Encoder params
Params = dict[str, Any]


def resize_positions(cfg: EncoderConfig, params: Params, *, max_len: int | None = None,
                     image_size: tuple[int, int] | None = None, method: str | None = None
                     ) -> tuple[EncoderConfig, Params]:
  """(cfg, params) with the learned position table resampled to `max_len` rows (text,
  `resample_position_table`, method "linear" by default; RoBERTa's `position_offset` rows
  are kept as they are) or to `image_size`'s patch grid (image, `resample_position_grid`,
  "bicubic" by default, [CLS] row kept). `params`: Encoder params or {"encoder": ...}."""
  if (max_len is None) == (image_size is None):
    raise ValueError("resize_positions: pass exactly one of max_len (text) or image_size (image)")
  if cfg.position_embedding != "learned":
    raise ValueError(f"position_embedding={cfg.position_embedding!r} has no learned table to "
                     "resize (sinusoidal extends to any length; for rope see rope_scaling)")
  wanted = "image" if image_size is not None else "text"
  if cfg.input_kind != wanted:
    raise ValueError(f"{'image_size' if image_size else 'max_len'} resizes {wanted} encoders; "
                     f"this one has input_kind={cfg.input_kind!r}")
  params = nn.meta.unbox(params)
  encoder = params[ENCODER] if ENCODER in params else params
  table_NxD = encoder[POSITION_TABLE[0]][POSITION_TABLE[1]][POSITION_TABLE[2]]
  if image_size is not None:
    new_cfg = cfg.replace(image_size=tuple(image_size))
    new_NxD = resample_position_grid(table_NxD, cfg.patch_grid, new_cfg.patch_grid,
                                     method or "bicubic")
  else:
    keep = cfg.position_offset
    if max_len <= keep:
      raise ValueError(f"max_len={max_len} leaves no positions after position_offset={keep}")
    new_cfg = cfg.replace(max_len=max_len)
    tail_MxD = resample_position_table(table_NxD[keep:], max_len - keep, method or "linear")
    new_NxD = jnp.concatenate([jnp.asarray(table_NxD[:keep], tail_MxD.dtype), tail_MxD])
  log.warning("position table resized by interpolation from %d to %d rows (%s): "
              "interpolated rows are untrained; fine-tune before relying on them",
              table_NxD.shape[0], num_positions(new_cfg),
              f"image_size {tuple(cfg.image_size)} -> {new_cfg.image_size}"
              if image_size is not None else f"max_len {cfg.max_len} -> {max_len}")
  new_encoder = _replace_table(encoder, new_NxD)
  return new_cfg, ({**params, ENCODER: new_encoder} if ENCODER in params else new_encoder)


def _replace_table(encoder: Params, table_NxD) -> Params:
  embeddings, table_name, leaf = POSITION_TABLE
  position = {**encoder[embeddings][table_name], leaf: table_NxD}
  return {**encoder, embeddings: {**encoder[embeddings], table_name: position}}
