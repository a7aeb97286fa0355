"""Multi-head self-attention with interchangeable implementations.

- `auto` (default): `cudnn` on GPU, `splash` on TPU, `xla` elsewhere (see flash.py).
- `xla`: the einsum reference; the only one that returns attention weights or drops them.
- `cudnn`, `splash`: flash kernels (flash.py); a call they cannot serve runs `xla`.
- `fused`: `jax.nn.dot_product_attention` with JAX's default implementation (XLA).
- `linear`: elu(x)+1 feature maps (Katharopoulos et al. 2020), O(L) in length.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.config import EncoderConfig
from jaxencoder.flash import (AttentionPlan, cudnn_attention, padded_segment_ids,
                              plan_attention, splash_attention)
from jaxencoder.layers import dense, take_rows
from jaxencoder.positions import apply_rope


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


def layer_rope(cfg: EncoderConfig, local, x_BxLxHxK, positions_BxL):
  """RoPE with the layer's base: `local_rope_base` on local layers, else `rope_base`.
  `local` None (no per-layer pattern), a bool, or a traced bool (scanned stack: both
  rotations, selected, so a scanned layer computes what its looped twin does)."""
  local_base = cfg.rope_base if cfg.local_rope_base is None else cfg.local_rope_base
  rope = lambda base: apply_rope(x_BxLxHxK, positions_BxL, base, cfg.rope_scaling)
  if local is None or isinstance(local, bool):
    return rope(local_base if local else cfg.rope_base)
  return jnp.where(local, rope(local_base), rope(cfg.rope_base))


def linear_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL):
  """Non-causal linear attention; padded keys are removed from the sums."""
  phi_q = jax.nn.elu(q_BxLxHxK.astype(jnp.float32)) + 1.0
  phi_k = jax.nn.elu(k_BxLxHxK.astype(jnp.float32)) + 1.0
  phi_k *= key_mask_BxL[:, :, None, None].astype(jnp.float32)
  kv_BxHxKxK = jnp.einsum("blhk,blhv->bhkv", phi_k, v_BxLxHxK.astype(jnp.float32))
  norm_BxLxH = jnp.einsum("blhk,bhk->blh", phi_q, phi_k.sum(axis=1))
  out = jnp.einsum("blhk,bhkv->blhv", phi_q, kv_BxHxKxK) / norm_BxLxH[..., None]
  return out.astype(v_BxLxHxK.dtype)


class MultiHeadAttention(nn.Module):
  """Q/K/V/O projections around one of the attention implementations.

  Self-attention by default. With `kv_BxSxD` it is cross-attention (a decoder reading an
  encoder's outputs): keys and values come from there, `key_mask_BxL` is their padding
  [B, S], the mask is [B, 1, L, S], and RoPE is not applied (the two sequences' positions
  are not comparable). `decode` keeps keys and values in a fixed-shape cache (`_cached`).
  """
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxD, mask_Bx1xLxL, bias_BxHxLxL, key_mask_BxL, positions_BxL,
               *, deterministic: bool, output_attentions: bool = False,
               query_rows_BxQ=None, segment_ids_BxL=None, plan: AttentionPlan | None = None,
               kv_BxSxD=None, decode: bool = False, cache_index=None, local=None,
               head_mask_H=None):
    """Attends from every position, or only from `query_rows_BxQ` (then L below reads Q
    for the queries and the output is [B, Q, D]; keys and values still span all L).

    `plan` (from flash.plan_attention; made here when None) says which implementation
    runs. The flash kernels read padding from `key_mask_BxL` and packed rows from
    `segment_ids_BxL`; only `xla` and `fused` read `mask_Bx1xLxL`, and only they serve
    cross-attention and cached decoding.

    `local` (cfg.global_attention_every > 0): whether this is a local layer (window, local
    RoPE base; the caller's mask already says which). A traced bool (scanned stack) has no
    static window, so only `xla` and `fused` serve it.

    `head_mask_H`: each head's output is scaled by it (0 drops the head) before the output
    projection, whichever implementation computed it.
    """
    cfg = self.cfg
    heads = (cfg.num_heads, cfg.resolved_head_dim)
    adapts = lambda name: cfg.lora_adapts(f"{self.name or 'attention'}/{name}/kernel")
    proj = lambda name, x_BxLxD: dense(cfg, heads, kernel_axes=("embed", "heads", "kv"), name=name,
                                       lora=adapts(name))(x_BxLxD, deterministic=deterministic)
    dropout_active = not deterministic and cfg.attention_dropout_rate > 0
    cross = kv_BxSxD is not None
    static_window = local is None or isinstance(local, bool)
    if plan is None:
      plan = plan_attention(cfg, output_attentions=output_attentions,
                            dropout_active=dropout_active, has_bias=bias_BxHxLxL is not None,
                            sparse_queries=query_rows_BxQ is not None,
                            per_layer_window=not static_window, cross=cross, decode=decode)
    window = cfg.sliding_window if local is None or (static_window and local) else None
    if not static_window and not plan.needs_dense_mask:
      raise ValueError(f"a per-layer window under nn.scan runs 'xla' or 'fused', not {plan.impl!r}")
    if (cross or decode) and not plan.needs_dense_mask:
      raise ValueError(f"cross-attention and cached decoding run 'xla' or 'fused', "
                       f"not {plan.impl!r}")
    q_positions_BxL = positions_BxL
    x_q_BxLxD = x_BxLxD
    kv_segments_BxL = q_segments_BxL = None
    if plan.impl == "splash":
      kv_segments_BxL = q_segments_BxL = padded_segment_ids(key_mask_BxL, segment_ids_BxL)
    if query_rows_BxQ is not None:
      x_q_BxLxD = take_rows(x_BxLxD, query_rows_BxQ)
      q_positions_BxL = take_rows(positions_BxL, query_rows_BxQ)
      mask_Bx1xLxL = None if mask_Bx1xLxL is None else take_rows(mask_Bx1xLxL, query_rows_BxQ, 2)
      bias_BxHxLxL = None if bias_BxHxLxL is None else take_rows(bias_BxHxLxL, query_rows_BxQ, 2)
      if q_segments_BxL is not None:
        q_segments_BxL = take_rows(q_segments_BxL, query_rows_BxQ)
    kv_BxLxD = kv_BxSxD if cross else x_BxLxD
    q_BxLxHxK = proj("query", x_q_BxLxD)
    k_BxLxHxK = proj("key", kv_BxLxD)
    v_BxLxHxK = proj("value", kv_BxLxD)
    if cfg.position_embedding == "rope" and not cross:
      q_BxLxHxK = layer_rope(cfg, local, q_BxLxHxK, q_positions_BxL)
      k_BxLxHxK = layer_rope(cfg, local, k_BxLxHxK, positions_BxL)
    if decode:
      k_BxLxHxK, v_BxLxHxK = self._cached(k_BxLxHxK, v_BxLxHxK, cache_index)
    probs_BxHxLxL = None
    if plan.impl == "linear":
      if output_attentions:
        raise ValueError("output_attentions needs attention_impl 'xla' or 'fused', not 'linear'")
      out_BxLxHxK = linear_attention(q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL)
    elif plan.impl == "cudnn":
      out_BxLxHxK = cudnn_attention(
          q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, causal=cfg.causal,
          sliding_window=window, bias_BxHxQxL=bias_BxHxLxL,
          mask_Bx1xQxL=mask_Bx1xLxL if segment_ids_BxL is not None else None)
    elif plan.impl == "splash":
      out_BxLxHxK = splash_attention(
          q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, q_segments_BxL, kv_segments_BxL,
          causal=cfg.causal, sliding_window=window, interpret=plan.interpret)
    elif plan.impl == "fused":
      out_BxLxHxK = jax.nn.dot_product_attention(
          q_BxLxHxK, k_BxLxHxK, v_BxLxHxK,
          bias=None if bias_BxHxLxL is None else bias_BxHxLxL.astype(q_BxLxHxK.dtype),
          mask=mask_Bx1xLxL)
    else:
      dropout = nn.Dropout(cfg.attention_dropout_rate, deterministic=deterministic)
      out_BxLxHxK, probs_BxHxLxL = xla_attention(
          q_BxLxHxK, k_BxLxHxK, v_BxLxHxK, mask_Bx1xLxL, bias_BxHxLxL, dropout)
    if head_mask_H is not None:
      out_BxLxHxK = out_BxLxHxK * head_mask_H.astype(out_BxLxHxK.dtype)[None, None, :, None]
    out_BxLxD = dense(cfg, cfg.emb_dim, axis=(-2, -1), kernel_axes=("heads", "kv", "embed"),
                      name="out", lora=adapts("out"))(out_BxLxHxK, deterministic=deterministic)
    return out_BxLxD, (probs_BxHxLxL if output_attentions else None)

  def _cached(self, k_BxTxHxK, v_BxTxHxK, cache_index):
    """Decoding: keys and values in a fixed-shape cache [B, S, H, K] ('cache' collection).

    `cache_index` None: creates it (zeros; S = this call's length) and returns this call's
    keys and values. Else writes this call's T = 1.. steps at `cache_index` and returns the
    whole cache: the caller's mask hides the rows not yet written.
    """
    cached_k = self.variable("cache", "cached_key", jnp.zeros, k_BxTxHxK.shape, k_BxTxHxK.dtype)
    cached_v = self.variable("cache", "cached_value", jnp.zeros, v_BxTxHxK.shape,
                             v_BxTxHxK.dtype)
    if cache_index is None:
      return k_BxTxHxK, v_BxTxHxK
    at = (0, cache_index, 0, 0)
    cached_k.value = jax.lax.dynamic_update_slice(cached_k.value, k_BxTxHxK, at)
    cached_v.value = jax.lax.dynamic_update_slice(cached_v.value, v_BxTxHxK, at)
    return cached_k.value, cached_v.value
