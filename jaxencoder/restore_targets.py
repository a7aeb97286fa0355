"""Restore targets: the ShapeDtypeStructs of a model's params, made without computing
them (`jax.eval_shape`); what a caller hands `RunDir` to restore into."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.config import EncoderConfig
from jaxencoder.encoder import ENCODER, Encoder
from jaxencoder.heads import EncoderForMaskedLM

Params = dict


def example_input(cfg: EncoderConfig) -> jax.Array:
  """One zero input of cfg's kind: ids [1, 8], images [1, H, W, C] or series [1, 8, F]."""
  if cfg.input_kind == "image":
    return jnp.zeros((1, *cfg.image_size, cfg.num_channels), jnp.float32)
  if cfg.input_kind == "series":
    return jnp.zeros((1, 8, cfg.input_features), jnp.float32)
  return jnp.zeros((1, 8), jnp.int32)


def abstract_params(cfg: EncoderConfig, model: nn.Module | None = None,
                    example: tuple | None = None) -> Params:
  """Unboxed ShapeDtypeStructs (on the first device) of a model's params.
  Default model: EncoderForMaskedLM ({"encoder": ..., "mlm_head": ...}) for text, else
  {"encoder": ...}; `example`: the model's init inputs (default: one input of cfg's kind)."""
  example = (example_input(cfg),) if example is None else example
  if model is None and cfg.input_kind != "text":
    shapes = {ENCODER: jax.eval_shape(Encoder(cfg).init, jax.random.key(0), *example)["params"]}
  else:
    model = EncoderForMaskedLM(cfg) if model is None else model
    shapes = jax.eval_shape(model.init, jax.random.key(0), *example)["params"]
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                      nn.meta.unbox(shapes))


def encoder_params(cfg: EncoderConfig, *, scan_layers: bool | None = None) -> Params:
  """The Encoder's params of `cfg` on one device, in its stack layout or `scan_layers`'."""
  if scan_layers is not None:
    cfg = dataclasses.replace(cfg, scan_layers=scan_layers)
  return abstract_params(cfg)[ENCODER]


def stored_encoder(run_dir, *, step: int | None = None, scan_layers: bool | None = None):
  """A run directory's (io/run_dir.RunDir) Encoder params of `step` (default: the newest
  that restores, see RunDir.newest_restorable) on one device, in its stored stack layout
  or `scan_layers`'."""
  restore = lambda s: run_dir.restore_encoder(
      encoder_params(run_dir.model_config(s), scan_layers=scan_layers), step=s)
  return run_dir.newest_restorable(restore, step)[1]
