"""The model side of a run directory. Restore targets: the ShapeDtypeStructs of a model's
params, made without computing them (`jax.eval_shape`); what a caller hands `RunDir` to
restore into. And what storage does not know: the stored EncoderConfig, the Encoder
restored in the target's stack layout, and an Encoder written as a run.

`run_dir` is an io/run_dir.RunDir (passed in: the model imports no storage).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import ENCODER, Encoder, in_scanned_stack
from jaxencoder.model.heads import EncoderForMaskedLM
from jaxencoder.model.stack_layout import loop_to_scan, scan_to_loop

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
  restore = lambda s: restore_encoder(
      run_dir, encoder_params(stored_config(run_dir, s), scan_layers=scan_layers), step=s)
  return run_dir.newest_restorable(restore, step)[1]


def stored_config(run_dir, step: int | None = None) -> EncoderConfig:
  """The EncoderConfig stored with `step` (default: the latest): its config's `model`
  section."""
  model = run_dir.read_config(step).get("model")
  if not model:
    step = run_dir.latest_step() if step is None else step
    raise ValueError(f"{run_dir.checkpoint_dir}: step {step} has no config with a 'model' "
                     "section")
  return EncoderConfig.from_dict(model)


def restore_encoder(run_dir, abstract: Params, *, step: int | None = None) -> Params:
  """The Encoder params of `step` (default: the newest that restores) into `abstract`:
  target ShapeDtypeStructs with shardings (encoder_params, or a train state's encoder
  subtree), in either stack layout: the saved layout (loop or scan) is converted to the
  target's, and a param whose shape differs raises naming it and both shapes."""
  return run_dir.newest_restorable(lambda s: _restore_in_layout(run_dir, abstract, s), step)[1]


def _restore_in_layout(run_dir, abstract: Params, step: int) -> Params:
  stored_scanned = stored_config(run_dir, step).scan_layers
  if _is_scanned(abstract) == stored_scanned:
    return run_dir.restore_subtree(abstract, ENCODER, step=step)
  to_stored = loop_to_scan if stored_scanned else scan_to_loop
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  saved = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                       jax.eval_shape(to_stored, abstract))
  params = run_dir.restore_subtree(saved, ENCODER, step=step)
  params = scan_to_loop(params) if stored_scanned else loop_to_scan(params)
  return jax.tree.map(lambda x, s: jax.device_put(x, s.sharding), params, abstract)


def _is_scanned(params: Params) -> bool:
  paths = [p for p, _ in jax.tree_util.tree_leaves_with_path(params)]
  return any(in_scanned_stack(p) for p in paths)


def write_encoder(run_dir, cfg: EncoderConfig, params: Params, tokenizer=None):
  """Saves params (Encoder or {"encoder", "mlm_head"}) and cfg as step 0 of a new
  `run_dir`, plus the tokenizer files: what `init_from` and probing read. Returns
  `run_dir`."""
  params = nn.meta.unbox(params)
  params = params if ENCODER in params else {ENCODER: params}
  return run_dir.write_params(params, {"model": cfg.to_dict()}, tokenizer)
