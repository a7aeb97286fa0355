"""Input checks that name the problem: shapes and dtypes always, values when concrete."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxencoder.model.config import EncoderConfig, image_stride_name


def _is_concrete(x) -> bool:
  """True for arrays holding values (not tracers inside jit/grad, not shape specs)."""
  return isinstance(x, (np.ndarray, jax.Array)) and not isinstance(x, jax.core.Tracer)


def _check_range(name: str, values, upper: int, what: str, traced: bool = False) -> None:
  """Raises if an integer array has a value outside [0, upper): at once for concrete
  values; with `traced`, also under jit, from a host callback when the step runs."""
  if isinstance(values, jax.core.Tracer) and traced:
    jax.debug.callback(lambda v: _raise_if_outside(name, np.asarray(v), upper, what), values)
    return
  if not _is_concrete(values) or np.size(values) == 0:
    return
  _raise_if_outside(name, np.asarray(values), upper, what)


def _raise_if_outside(name: str, values: np.ndarray, upper: int, what: str) -> None:
  low, high = int(values.min(initial=0)), int(values.max(initial=0))
  if low < 0 or high >= upper:
    bad = low if low < 0 else high
    where = tuple(int(i) for i in np.argwhere(values == bad)[0])
    raise ValueError(f"{name}{list(where)} = {bad}, outside [0, {upper}) ({what})")


def check_inputs(cfg: EncoderConfig, inputs, attention_mask=None, token_type_ids=None,
                 segment_ids=None, positions=None) -> tuple[int, int]:
  """Validates the encoder's inputs against its config; raises ValueError.

  Returns (batch, length) of the token/patch/step axis before any [CLS] is added.
  """
  if cfg.input_kind == "text":
    _check_text(cfg, inputs)
    len_BxL = tuple(inputs.shape)
  elif cfg.input_kind == "image":
    _check_image(cfg, inputs)
    b, h, w, _ = inputs.shape
    len_BxL = (b, (h // cfg.image_stride) * (w // cfg.image_stride))
  else:
    _check_series(cfg, inputs)
    len_BxL = tuple(inputs.shape[:2])
  if positions is not None and cfg.input_kind != "text":
    raise ValueError("positions are only accepted for text inputs; image and series "
                     "positions are 0..L-1 (per segment when segment_ids are given)")
  for name, arr in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids),
                    ("segment_ids", segment_ids), ("positions", positions)):
    if arr is not None and tuple(arr.shape) != len_BxL:
      raise ValueError(f"{name} has shape {tuple(arr.shape)} but the inputs need {len_BxL} "
                       f"(batch, length)")
  if token_type_ids is not None:
    if not cfg.type_vocab_size:
      raise ValueError("token_type_ids given but type_vocab_size=0 (no type embeddings)")
    _check_range("token_type_ids", token_type_ids, cfg.type_vocab_size, "type_vocab_size",
                 cfg.check_ids)
  if cfg.position_embedding == "learned" and cfg.input_kind != "image":
    total_len = len_BxL[1] + int(cfg.input_kind == "series" and cfg.use_cls_token)
    rows = cfg.max_positions  # max_len - position_offset
    if total_len > rows:
      table = (f"max_len={cfg.max_len}" if not cfg.position_offset else
               f"max_len={cfg.max_len} - position_offset={cfg.position_offset} = {rows} rows")
      raise ValueError(f"sequence length {total_len} is longer than the position table "
                       f"({table})")
    _check_range("positions", positions, rows, "max_len - position_offset of the position table")
  return len_BxL


def _check_text(cfg: EncoderConfig, ids) -> None:
  if ids.ndim != 2 or not jnp.issubdtype(ids.dtype, jnp.integer):
    raise ValueError(f"input_ids must be an integer array [batch, length]; got shape "
                     f"{tuple(ids.shape)} and dtype {ids.dtype}")
  _check_range("input_ids", ids, cfg.vocab_size, "token ids must be < vocab_size",
               cfg.check_ids)


def _check_image(cfg: EncoderConfig, images) -> None:
  if images.ndim != 4 or not jnp.issubdtype(images.dtype, jnp.floating):
    raise ValueError(f"images must be a float array [batch, height, width, channels]; got "
                     f"shape {tuple(images.shape)} and dtype {images.dtype}")
  _, h, w, c = images.shape
  if c != cfg.num_channels:
    raise ValueError(f"images have {c} channels but num_channels={cfg.num_channels}")
  if h % cfg.image_stride or w % cfg.image_stride:
    raise ValueError(f"image size {(h, w)} is not divisible by {image_stride_name(cfg)}")
  if cfg.position_embedding == "learned" and (h, w) != tuple(cfg.image_size):
    raise ValueError(f"image size {(h, w)} differs from image_size={tuple(cfg.image_size)}, "
                     "which fixes the learned position table")


def _check_series(cfg: EncoderConfig, series) -> None:
  if series.ndim != 3 or not jnp.issubdtype(series.dtype, jnp.floating):
    raise ValueError(f"series must be a float array [batch, length, features]; got shape "
                     f"{tuple(series.shape)} and dtype {series.dtype}")
  if series.shape[-1] != cfg.input_features:
    raise ValueError(f"series have {series.shape[-1]} features but "
                     f"input_features={cfg.input_features}")


def check_output_positions(output_positions, batch_size: int, length: int) -> None:
  """output_positions must be integer [B, M] indices into the encoder's L positions
  (L counts a prepended [CLS] for image and series inputs)."""
  shape = tuple(output_positions.shape)
  if len(shape) != 2 or shape[0] != batch_size:
    raise ValueError(f"output_positions must be [batch, M] = [{batch_size}, M]; got shape {shape}")
  if not jnp.issubdtype(output_positions.dtype, jnp.integer):
    raise ValueError(f"output_positions must be integer indices; got {output_positions.dtype}")
  _check_range("output_positions", output_positions, length, "the encoder's sequence length")
