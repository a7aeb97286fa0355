"""Converting params between the looped (`layers_0`, `layers_1`, …) and scanned
(`layers`, stacked on a leading axis) layouts of the encoder stack.

Both functions find the stack anywhere in a nested params dict (e.g. under
`encoder` in EncoderForMaskedLM) and accept boxed (logically partitioned) params,
which they unbox.
"""

from __future__ import annotations

from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.model.encoder import SCANNED_LAYERS, layer_index, layer_name


def loop_to_scan(params: Mapping[str, Any]) -> dict[str, Any]:
  """{'layers_0': p0, …, 'layers_{N-1}': pN} -> {'layers': stack(p0 … pN)}."""
  params = nn.meta.unbox(params)
  return _convert(params, _stack_level)


def scan_to_loop(params: Mapping[str, Any]) -> dict[str, Any]:
  """{'layers': stacked [N, …]} -> {'layers_0': …, 'layers_{N-1}': …}."""
  params = nn.meta.unbox(params)
  return _convert(params, _unstack_level)


def _convert(tree, level_fn):
  if not isinstance(tree, Mapping):
    return tree
  converted = level_fn(tree)
  if converted is not None:
    return converted
  return {k: _convert(v, level_fn) for k, v in tree.items()}


def _stack_level(tree: Mapping[str, Any]) -> dict[str, Any] | None:
  indices = sorted(i for k in tree if (i := layer_index((k,))) is not None)
  if not indices:
    return None
  if indices != list(range(len(indices))):
    raise ValueError(f"looped layers must be numbered 0..N-1, got {indices}")
  layers = [tree[layer_name(i)] for i in indices]
  rest = {k: v for k, v in tree.items() if layer_index((k,)) is None}
  return {**rest, SCANNED_LAYERS: jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}


def _unstack_level(tree: Mapping[str, Any]) -> dict[str, Any] | None:
  if not isinstance(tree.get(SCANNED_LAYERS), Mapping):
    return None
  stacked = tree[SCANNED_LAYERS]
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  rest = {k: v for k, v in tree.items() if k != SCANNED_LAYERS}
  for i in range(num_layers):
    rest[layer_name(i)] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return rest
