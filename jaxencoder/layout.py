"""Converting params between the looped (`layers_0`, `layers_1`, …) and scanned
(`layers`, stacked on a leading axis) layouts of the encoder stack.

Both functions find the stack anywhere in a nested params dict (e.g. under
`encoder` in EncoderForMaskedLM) and accept boxed (logically partitioned) params,
which they unbox.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

_LOOP_KEY = re.compile(r"^layers_(\d+)$")


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
  indices = sorted(int(m.group(1)) for k in tree if (m := _LOOP_KEY.match(k)))
  if not indices:
    return None
  if indices != list(range(len(indices))):
    raise ValueError(f"looped layers must be numbered 0..N-1, got {indices}")
  layers = [tree[f"layers_{i}"] for i in indices]
  rest = {k: v for k, v in tree.items() if not _LOOP_KEY.match(k)}
  return {**rest, "layers": jax.tree.map(lambda *xs: jnp.stack(xs), *layers)}


def _unstack_level(tree: Mapping[str, Any]) -> dict[str, Any] | None:
  if "layers" not in tree or not isinstance(tree["layers"], Mapping):
    return None
  stacked = tree["layers"]
  num_layers = jax.tree.leaves(stacked)[0].shape[0]
  rest = {k: v for k, v in tree.items() if k != "layers"}
  for i in range(num_layers):
    rest[f"layers_{i}"] = jax.tree.map(lambda x, i=i: x[i], stacked)
  return rest
