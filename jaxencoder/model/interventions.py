"""Interventions inside the encoder's forward pass: patch, erase or ablate what a layer or
a head outputs, for causal probing (activation patching, amnesic probing).

Layer n is hidden_states[n + 1]: block n's output, and for a pre-norm model's last layer
the stream after its final norm (the Encoder applies that layer's stream edits there; see
`without_stream`). A head's output is what it hands the output projection, where
`head_mask` acts ([B, L, H, K] per layer: `head_outputs`).
Every field holds all N layers; a block reads its own row (an int in a loop, traced under
nn.scan), so one compiled program serves every layer. Fields left None cost nothing.

  edits = Interventions.patch_layers(where_NxBxL, jnp.stack(clean.hidden_states[1:]))
  out = Encoder(cfg).apply(variables, corrupted_ids, interventions=edits)
"""

from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp
import numpy as np

from jaxencoder.model.config import EncoderConfig


@flax.struct.dataclass
class Interventions:
  """What to change in which layer; a pytree (it passes through jit and nn.scan).

  `*_where_*` are 0/1 (1 = replace); a `where` without its `value` zeroes what it marks.
  At a layer with `layer_erase_N[n] == 1`, every position's x becomes
  `x @ layer_matrix_NxDxD[n] + layer_bias_NxD[n]` (an affine eraser, e.g. LEACE) first;
  then `layer_where` picks the positions that take `layer_value`.
  """
  layer_where_NxBxL: jax.Array | None = None
  layer_value_NxBxLxD: jax.Array | None = None
  layer_matrix_NxDxD: jax.Array | None = None
  layer_bias_NxD: jax.Array | None = None
  layer_erase_N: jax.Array | None = None
  head_where_NxBxLxH: jax.Array | None = None
  head_value_NxBxLxHxK: jax.Array | None = None

  @classmethod
  def patch_layers(cls, where_NxBxL, value_NxBxLxD) -> Interventions:
    """Layer n's output at (b, l) becomes value[n, b, l] where where[n, b, l] is 1: e.g.
    a clean run's hidden_states[1:], stacked, patched into a corrupted run."""
    return cls(layer_where_NxBxL=where_NxBxL, layer_value_NxBxLxD=value_NxBxLxD)

  @classmethod
  def zero_layers(cls, where_NxBxL) -> Interventions:
    """Zero-ablation of the marked positions of each layer's output."""
    return cls(layer_where_NxBxL=where_NxBxL)

  @classmethod
  def mean_ablate_layers(cls, where_NxBxL, mean_NxD) -> Interventions:
    """The marked positions of layer n's output become mean_NxD[n] (e.g. its mean over a
    dataset's real tokens)."""
    where_NxBxL, mean_NxD = jnp.asarray(where_NxBxL), jnp.asarray(mean_NxD)
    value_NxBxLxD = jnp.broadcast_to(mean_NxD[:, None, None, :],
                                     where_NxBxL.shape + mean_NxD.shape[-1:])
    return cls.patch_layers(where_NxBxL, value_NxBxLxD)

  @classmethod
  def erase(cls, layer: int, eraser_matrix_DxD, eraser_bias_D, num_layers: int) -> Interventions:
    """Layer `layer`'s output x becomes x @ eraser_matrix_DxD + eraser_bias_D at every
    position (a probing.erasure.AffineEraser's matrix_DxD and bias_D); other layers keep
    theirs."""
    if not 0 <= layer < num_layers:
      raise ValueError(f"erase: layer {layer} is outside [0, {num_layers}) (num_layers)")
    matrix_DxD, bias_D = jnp.asarray(eraser_matrix_DxD), jnp.asarray(eraser_bias_D)
    return cls(layer_matrix_NxDxD=jnp.broadcast_to(matrix_DxD, (num_layers,) + matrix_DxD.shape),
               layer_bias_NxD=jnp.broadcast_to(bias_D, (num_layers,) + bias_D.shape),
               layer_erase_N=jnp.zeros(num_layers, jnp.float32).at[layer].set(1.0))

  @classmethod
  def patch_heads(cls, where_NxBxLxH, value_NxBxLxHxK) -> Interventions:
    """Head h of layer n at (b, l) outputs value[n, b, l, h] where where[n, b, l, h] is 1:
    e.g. a clean run's head_outputs, stacked."""
    return cls(head_where_NxBxLxH=where_NxBxLxH, head_value_NxBxLxHxK=value_NxBxLxHxK)

  @classmethod
  def zero_heads(cls, where_NxBxLxH) -> Interventions:
    """Zero-ablation of heads at chosen positions (at every position: head_mask 0)."""
    return cls(head_where_NxBxLxH=where_NxBxLxH)

  def combine(self, other: Interventions) -> Interventions:
    """Both sets of edits in one; a field both set is refused."""
    both = [f.name for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None and getattr(other, f.name) is not None]
    if both:
      raise ValueError(f"combine: both interventions set {both}; merge those arrays first")
    return self.replace(**{f.name: getattr(other, f.name) for f in dataclasses.fields(self)
                           if getattr(other, f.name) is not None})

  def checked(self, cfg: EncoderConfig, batch: int, length: int) -> Interventions:
    """These interventions as float arrays of the shapes the model needs; one ValueError
    naming the field, its shape and the expected one otherwise."""
    sizes = {"N": cfg.num_layers, "B": batch, "L": length, "D": cfg.emb_dim,
             "H": cfg.num_heads, "K": cfg.resolved_head_dim}
    # the field's shape is in its name: layer_value_NxBxLxD is [N, B, L, D]
    letters = {f.name: f.name.rsplit("_", 1)[1].split("x") for f in dataclasses.fields(self)}
    for name, needed in (("layer_value_NxBxLxD", "layer_where_NxBxL"),
                         ("head_value_NxBxLxHxK", "head_where_NxBxLxH")):
      if getattr(self, name) is not None and getattr(self, needed) is None:
        raise ValueError(f"interventions: {name} is set without {needed} (which positions)")
    erase = ("layer_matrix_NxDxD", "layer_bias_NxD", "layer_erase_N")
    if len({getattr(self, name) is None for name in erase}) > 1:
      raise ValueError(f"interventions: set all of {list(erase)} or none "
                       "(Interventions.erase builds them)")
    arrays = {}
    for name, axes in letters.items():
      value, shape = getattr(self, name), [sizes[a] for a in axes]
      if value is None:
        continue
      if list(np.shape(value)) != shape:
        raise ValueError(f"interventions.{name} has shape {tuple(np.shape(value))}, expected "
                         f"[{', '.join(axes)}] = {shape}")
      arrays[name] = jnp.asarray(value, jnp.float32)
    return self.replace(**arrays)

  def without_stream(self, layer: int) -> Interventions:
    """A copy whose layer `layer` keeps its stream (no patch, no erasure; its head edits
    stay): the Encoder applies them after a pre-norm model's final norm instead."""
    off = lambda x: None if x is None else jnp.asarray(x).at[layer].set(0)
    return self.replace(layer_where_NxBxL=off(self.layer_where_NxBxL),
                        layer_erase_N=off(self.layer_erase_N))

  def at_layer(self, index) -> LayerEdit:
    """Layer `index`'s edits (index an int, or traced under nn.scan)."""
    row = lambda x: None if x is None else x[index]
    return LayerEdit(row(self.layer_where_NxBxL), row(self.layer_value_NxBxLxD),
                     row(self.layer_matrix_NxDxD), row(self.layer_bias_NxD),
                     row(self.layer_erase_N), row(self.head_where_NxBxLxH),
                     row(self.head_value_NxBxLxHxK))


@flax.struct.dataclass
class LayerEdit:
  """One layer's row of each Interventions field (None where absent)."""
  where_BxL: jax.Array | None
  value_BxLxD: jax.Array | None
  matrix_DxD: jax.Array | None
  bias_D: jax.Array | None
  erase: jax.Array | None  # scalar 0/1
  head_where_BxLxH: jax.Array | None
  head_value_BxLxHxK: jax.Array | None

  def stream(self, x_BxLxD):
    """The block's output after this layer's erasure, then its patches."""
    if self.matrix_DxD is not None:
      erased_BxLxD = jnp.dot(x_BxLxD.astype(jnp.float32), self.matrix_DxD,
                             precision=jax.lax.Precision.HIGHEST) + self.bias_D[None, None]
      x_BxLxD = jnp.where(self.erase != 0, erased_BxLxD.astype(x_BxLxD.dtype), x_BxLxD)
    if self.where_BxL is not None:
      x_BxLxD = _replace(x_BxLxD, self.where_BxL[..., None], self.value_BxLxD)
    return x_BxLxD

  def heads(self, out_BxLxHxK):
    """The heads' outputs [B, L, H, K] after this layer's head patches."""
    if self.head_where_BxLxH is None:
      return out_BxLxHxK
    return _replace(out_BxLxHxK, self.head_where_BxLxH[..., None], self.head_value_BxLxHxK)


def _replace(x, where, value):
  """x with `value` (zeros when None) where `where` (broadcast to x) is nonzero."""
  new = jnp.zeros((), x.dtype) if value is None else value.astype(x.dtype)
  return jnp.where(where != 0, new, x)
