"""Multi-head self-attention with interchangeable implementations.

- `auto` (default): `cudnn` on GPU, `splash` on TPU, `xla` elsewhere (see flash.py).
- `xla`: the einsum reference; the only one that returns attention weights or drops them.
- `cudnn`, `splash`: flash kernels (flash.py); a call they cannot serve runs `xla`.
- `fused`: `jax.nn.dot_product_attention` with JAX's default implementation (XLA); no
  attention dropout (a training call with it runs `xla`).
- `linear`: elu(x)+1 feature maps (Katharopoulos et al. 2020), O(L) in length; no weights
  to drop (attention dropout in training is refused).

Each is a kernel with one signature, `kernel(q, k, v, call: KernelCall) -> (out, weights or
None)`, in its row of `flash.IMPLEMENTATIONS`; a layer runs the one its plan names
(`plan.kernel`). The layers: `MultiHeadAttention` (the encoder's self-attention) here, the
decoder's cached self-attention and cross-attention in decoder.py, all on `AttentionLayer`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.layers import dense, take_rows
from jaxencoder.model.positions import apply_rope


@dataclasses.dataclass(frozen=True)
class KernelCall:
  """What an attention kernel reads besides q [B, Q, H, K], k and v [B, L, H, K]; each
  kernel reads its share: `xla` and `fused` the dense mask and bias, the flash kernels the
  padding, packed rows, causal flag and window (static mask types, no [B, 1, Q, L] mask)."""
  mask_Bx1xQxL: jax.Array | None  # True where query q may see key l
  bias_BxHxQxL: jax.Array | None  # additive (T5's relative position bias)
  key_mask_BxL: jax.Array  # the keys' padding (1 = a real token)
  causal: bool = False
  window: int | None = None  # this layer's sliding window
  dropout: Callable[[jax.Array], jax.Array] | None = None  # on the attention weights (xla)
  segment_ids_BxL: jax.Array | None = None  # packed rows (0 = padding); None: not packed
  query_rows_BxQ: jax.Array | None = None  # the rows the queries were gathered from
  interpret: bool = False  # splash in Pallas interpret mode (off TPU)


def xla_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask_Bx1xLxL, bias_BxHxLxL,
                  dropout: nn.Module | None = None):
  """Reference attention; softmax in float32. Returns (out [B,L,H,K], probs [B,H,L,L])."""
  scale = q_BxLxHxK.shape[-1] ** -0.5
  logits_BxHxLxL = jnp.einsum("bqhk,bshk->bhqs", q_BxLxHxK * scale, k_BxLxHxK,
                              preferred_element_type=jnp.float32)
  if bias_BxHxLxL is not None:
    logits_BxHxLxL += bias_BxHxLxL.astype(jnp.float32)
  if mask_Bx1xLxL is not None:
    logits_BxHxLxL = jnp.where(mask_Bx1xLxL, logits_BxHxLxL,
                               jnp.finfo(jnp.float32).min)
  probs_BxHxLxL = jax.nn.softmax(logits_BxHxLxL, axis=-1)
  dropped = probs_BxHxLxL if dropout is None else dropout(probs_BxHxLxL)
  out_BxLxHxK = jnp.einsum("bhqs,bshk->bqhk", dropped.astype(v_BxLxHxK.dtype), v_BxLxHxK)
  return out_BxLxHxK, probs_BxHxLxL


def linear_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL):
  """Non-causal linear attention; padded keys are removed from the sums."""
  phi_q = jax.nn.elu(q_BxLxHxK.astype(jnp.float32)) + 1.0
  phi_k = jax.nn.elu(k_BxLxHxK.astype(jnp.float32)) + 1.0
  phi_k *= key_mask_BxL[:, :, None, None].astype(jnp.float32)
  kv_BxHxKxK = jnp.einsum("blhk,blhv->bhkv", phi_k, v_BxLxHxK.astype(jnp.float32))
  norm_BxLxH = jnp.einsum("blhk,bhk->blh", phi_q, phi_k.sum(axis=1))
  out = jnp.einsum("blhk,bhkv->blhv", phi_q, kv_BxHxKxK) / norm_BxLxH[..., None]
  return out.astype(v_BxLxHxK.dtype)


# The kernels of `xla`, `fused` and `linear` (flash.py holds those of `cudnn` and `splash`).
def xla_kernel(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, call: KernelCall):
  return xla_attention(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, call.mask_Bx1xQxL, call.bias_BxHxQxL,
                       call.dropout)


def fused_kernel(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, call: KernelCall):
  bias_BxHxQxL = call.bias_BxHxQxL
  out_BxQxHxK = jax.nn.dot_product_attention(
      q_BxQxHxK, k_BxLxHxK, v_BxLxHxK,
      bias=None if bias_BxHxQxL is None else bias_BxHxQxL.astype(q_BxQxHxK.dtype),
      mask=call.mask_Bx1xQxL)
  return out_BxQxHxK, None


def linear_kernel(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, call: KernelCall):
  return linear_attention(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, call.key_mask_BxL), None


def layer_rope(cfg: EncoderConfig, local, x_BxLxHxK, positions_BxL):
  """RoPE with the layer's base: `local_rope_base` on local layers, else `rope_base`.
  `local` None (no per-layer pattern), a bool, or a traced bool (scanned stack: both
  rotations, selected, so a scanned layer computes what its looped twin does)."""
  local_base = cfg.rope_base if cfg.local_rope_base is None else cfg.local_rope_base
  rope = lambda base: apply_rope(x_BxLxHxK, positions_BxL, base, cfg.rope_scaling)
  if local is None or isinstance(local, bool):
    return rope(local_base if local else cfg.rope_base)
  return jnp.where(local, rope(local_base), rope(cfg.rope_base))


class AttentionLayer(nn.Module):
  """What every attention layer shares: the Q / K / V projections to heads (`heads`), the
  dropout of the weights and the output projection (`merge_heads`), each with LoRA
  adapters where `cfg.lora_targets` names them. The layer's `__call__` wires them around
  the kernel its plan names."""
  cfg: EncoderConfig

  def _adapts(self, name: str) -> bool:
    return self.cfg.lora_adapts(f"{self.name or 'attention'}/{name}/kernel")

  def heads(self, name: str, x_BxLxD, deterministic: bool):
    """Projection `name` (query, key or value): [B, L, D] -> [B, L, H, K]."""
    cfg = self.cfg
    return dense(cfg, (cfg.num_heads, cfg.resolved_head_dim), kernel_axes=("embed", "heads", "kv"),
                 name=name, lora=self._adapts(name))(x_BxLxD, deterministic=deterministic)

  def weights_dropout(self, deterministic: bool) -> nn.Module:
    return nn.Dropout(self.cfg.attention_dropout_rate, deterministic=deterministic)

  def merge_heads(self, out_BxLxHxK, deterministic: bool):
    """The output projection: [B, L, H, K] -> [B, L, D]."""
    return dense(self.cfg, self.cfg.emb_dim, axis=(-2, -1), kernel_axes=("heads", "kv", "embed"),
                 name="out", lora=self._adapts("out"))(out_BxLxHxK, deterministic=deterministic)


@flax.struct.dataclass
class AttentionInputs:
  """What one encoder layer's self-attention reads besides its input x [B, L, D]."""
  mask_Bx1xLxL: jax.Array | None  # this layer's (local or global); None for flash kernels
  bias_BxHxLxL: jax.Array | None
  key_mask_BxL: jax.Array
  positions_BxL: jax.Array | None
  segment_ids_BxL: jax.Array | None  # packed rows (0 = padding); None when not packed
  # A flash.AttentionPlan (not imported: flash imports this module's kernels).
  plan: Any = flax.struct.field(pytree_node=False)
  # Whether this is a local layer (cfg.global_attention_every > 0: window, local RoPE
  # base; the mask already says which): None, a bool, or traced (a plain scan).
  local: Any = None
  head_mask_H: jax.Array | None = None  # scales each head's output (0 drops it)
  # This layer's interventions.LayerEdit (its `heads` patches the heads' outputs); None.
  edit: Any = None


class MultiHeadAttention(AttentionLayer):
  """The encoder's self-attention: Q/K/V/O projections around the kernel `inputs.plan`
  names (flash.plan_attention / plan_layers)."""

  @nn.compact
  def __call__(self, x_BxLxD, inputs: AttentionInputs, query_rows_BxQ=None, *,
               deterministic: bool):
    """(out [B, L, D], attention weights [B, H, L, L] or None: only `xla` returns them,
    the heads' outputs [B, L, H, K] that the output projection reads).

    Attends from every position, or only from `query_rows_BxQ` (then L above reads Q for
    the queries and the output is [B, Q, D]; keys and values still span all L).
    A traced `inputs.local` (scanned stack) has no static window: only `xla` and `fused`
    serve it. `inputs.head_mask_H` scales each head's output before the output projection,
    whichever kernel computed it; then `inputs.edit` patches it.
    """
    cfg, plan, local = self.cfg, inputs.plan, inputs.local
    static_window = local is None or isinstance(local, bool)
    if not static_window and not plan.needs_dense_mask:
      raise ValueError(f"a per-layer window under nn.scan runs 'xla' or 'fused', not {plan.impl!r}")
    x_q_BxQxD, q_positions_BxQ = x_BxLxD, inputs.positions_BxL
    mask_Bx1xQxL, bias_BxHxQxL = inputs.mask_Bx1xLxL, inputs.bias_BxHxLxL
    if query_rows_BxQ is not None:
      x_q_BxQxD = take_rows(x_BxLxD, query_rows_BxQ)
      q_positions_BxQ = take_rows(inputs.positions_BxL, query_rows_BxQ)
      mask_Bx1xQxL = None if mask_Bx1xQxL is None else take_rows(mask_Bx1xQxL, query_rows_BxQ, 2)
      bias_BxHxQxL = None if bias_BxHxQxL is None else take_rows(bias_BxHxQxL, query_rows_BxQ, 2)
    q_BxQxHxK = self.heads("query", x_q_BxQxD, deterministic)
    k_BxLxHxK = self.heads("key", x_BxLxD, deterministic)
    v_BxLxHxK = self.heads("value", x_BxLxD, deterministic)
    if cfg.position_embedding == "rope":
      q_BxQxHxK = layer_rope(cfg, local, q_BxQxHxK, q_positions_BxQ)
      k_BxLxHxK = layer_rope(cfg, local, k_BxLxHxK, inputs.positions_BxL)
    window = cfg.sliding_window if local is None or (static_window and local) else None
    call = KernelCall(mask_Bx1xQxL, bias_BxHxQxL, inputs.key_mask_BxL, cfg.causal, window,
                      self.weights_dropout(deterministic), inputs.segment_ids_BxL,
                      query_rows_BxQ, plan.interpret)
    out_BxQxHxK, probs_BxHxQxL = plan.kernel(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, call)
    if inputs.head_mask_H is not None:
      out_BxQxHxK = out_BxQxHxK * inputs.head_mask_H.astype(out_BxQxHxK.dtype)[None, None, :, None]
    if inputs.edit is not None:
      out_BxQxHxK = inputs.edit.heads(out_BxQxHxK)
    return self.merge_heads(out_BxQxHxK, deterministic), probs_BxHxQxL, out_BxQxHxK
