"""LoRA adapters in a param tree (Hu et al. 2021): split them off, put them back, merge them
into their kernels, count them. The adapters themselves are made by layers.Dense
(`lora_a` [in..., R], `lora_b` [R, out...] beside its `kernel`); a scanned stack holds
each with a leading [N] axis. Params here are unboxed nested dicts.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import SCANNED_LAYERS, path_parts

LORA_A, LORA_B = "lora_a", "lora_b"
ADAPTERS = (LORA_A, LORA_B)
FIELDS = tuple(f.name for f in dataclasses.fields(EncoderConfig) if f.name.startswith("lora_"))
Params = Any


def is_adapter(path) -> bool:
  """Whether `path` (a '/'-joined string, names or a jax key path) is a LoRA adapter."""
  return path_parts(path)[-1] in ADAPTERS


def has_adapters(params: Params) -> bool:
  return any(is_adapter(p) for p, _ in jax.tree_util.tree_leaves_with_path(params))


def split(params: Params) -> tuple[Params, Params]:
  """(base, adapters): the tree without its adapters, and only its adapters (same nesting)."""
  return _filter(params, keep_adapters=False), _filter(params, keep_adapters=True)


def join(base: Params, adapters: Params) -> Params:
  """`split`'s inverse: the two trees as one."""
  if not isinstance(adapters, Mapping):
    return adapters
  joined = dict(base)
  for key, value in adapters.items():
    joined[key] = join(base.get(key, {}), value)
  return joined


def merge(params: Params, cfg: EncoderConfig, *, stacked: bool = False) -> Params:
  """The tree with every kernel W that has adapters replaced by W + (alpha / r) A B and the
  adapters removed: what a model with lora_rank=0 computes the same with. `stacked`: the
  tree is a scanned stack's (found by name below)."""
  if not isinstance(params, Mapping):
    return params
  merged = {k: merge(v, cfg, stacked=stacked or k == SCANNED_LAYERS)
            for k, v in params.items() if k not in ADAPTERS}
  if LORA_A in params:
    kernel = params["kernel"]
    update = delta(params[LORA_A], params[LORA_B], cfg.lora_scale, lead=int(stacked))
    merged["kernel"] = (kernel.astype(jnp.float32) + update).astype(kernel.dtype)
  return merged


def delta(a, b, scale: float, *, lead: int = 0) -> jax.Array:
  """scale * A B in the kernel's shape: A [lead..., in..., R], B [lead..., R, out...] ->
  [lead..., in..., out...] in float32 (lead 1: a scanned stack's [N])."""
  in_shape, out_shape = a.shape[lead:-1], b.shape[lead + 1:]
  a_xIxR = jnp.reshape(a, a.shape[:lead] + (-1, a.shape[-1])).astype(jnp.float32)
  b_xRxO = jnp.reshape(b, b.shape[:lead] + (b.shape[lead], -1)).astype(jnp.float32)
  update = scale * jnp.matmul(a_xIxR, b_xRxO, precision="highest")
  return update.reshape(a.shape[:lead] + in_shape + out_shape)


def count(params: Params) -> tuple[int, int]:
  """(adapter params, all params) of a tree."""
  leaves = jax.tree_util.tree_leaves_with_path(params)
  sizes = [(is_adapter(p), int(np.prod(x.shape))) for p, x in leaves]
  return sum(n for a, n in sizes if a), sum(n for _, n in sizes)


def _filter(tree: Params, keep_adapters: bool) -> Params:
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      sub = _filter(value, keep_adapters)
      if sub or not keep_adapters:
        out[key] = sub
    elif (key in ADAPTERS) == keep_adapters:
      out[key] = value
  return out


def without_adapters(cfg: EncoderConfig) -> EncoderConfig:
  """cfg with LoRA off (its fields at their defaults): the config of `merge`'s params."""
  return cfg.replace(**{name: getattr(EncoderConfig, name) for name in FIELDS})
