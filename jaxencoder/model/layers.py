"""Small building blocks shared by the encoder's modules: dense, norms, dtypes."""

from __future__ import annotations

import math
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.model.config import EncoderConfig

# Logical activation axes; rules in the training config map them to mesh axes.
ACT_BLD = ("act_batch", "act_len", "act_embed")


def dtype_of(name: str) -> jnp.dtype:
  return jnp.dtype(name)


def kernel_init(cfg: EncoderConfig, axes: Sequence[str | None]):
  """BERT's truncated-normal init, tagged with logical axis names."""
  init = nn.initializers.truncated_normal(stddev=cfg.initializer_range)
  return nn.with_logical_partitioning(init, tuple(axes))


def zeros_init(axes: Sequence[str | None]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), tuple(axes))


class Dense(nn.Module):
  """y = x . W (+ b), contracting the trailing `axis` of x with the leading axes of W.

  Unlike nn.DenseGeneral, the kernel is created in its final shape, so its
  logical axis names always match its rank (also under a mesh). The product runs
  as one 2-D matmul, [T, prod(in)] x [prod(in), prod(out)]: the reshapes are free
  (row-major), and XLA then needs no transposes of [D, H, K] kernels or their
  gradients (about 260 copies per BERT-base train step on CPU otherwise).

  `lora`: adds cfg.lora_rank adapters beside the kernel (lora.py).
  """
  features: tuple[int, ...]
  axis: tuple[int, ...]
  kernel_axes: tuple[str | None, ...]
  use_bias: bool
  cfg: EncoderConfig
  lora: bool = False

  @nn.compact
  def __call__(self, x, *, deterministic: bool = True):
    axis = tuple(a % x.ndim for a in self.axis)
    num_lead = x.ndim - len(axis)
    if axis != tuple(range(num_lead, x.ndim)):
      raise ValueError(f"Dense contracts trailing axes only, got axis={self.axis} for rank {x.ndim}")
    kernel_shape = x.shape[num_lead:] + self.features
    kernel = self.param("kernel", kernel_init(self.cfg, self.kernel_axes), kernel_shape,
                        dtype_of(self.cfg.param_dtype))
    dtype = dtype_of(self.cfg.dtype)
    fan_in, fan_out = math.prod(x.shape[num_lead:]), math.prod(self.features)
    lead = x.shape[:num_lead]
    x_TxI = x.astype(dtype).reshape(lead + (fan_in,))
    y_TxO = x_TxI @ kernel.astype(dtype).reshape(fan_in, fan_out)
    if self.use_bias:
      bias_axes = self.kernel_axes[len(axis):]
      bias = self.param("bias", zeros_init(bias_axes), self.features,
                        dtype_of(self.cfg.param_dtype))
      y_TxO = y_TxO + bias.astype(dtype).reshape((1,) * len(lead) + (fan_out,))
    if self.lora and self.cfg.lora_rank:
      y_TxO = y_TxO + self._adapters(x_TxI, x.shape[num_lead:], deterministic)
    return y_TxO.reshape(lead + self.features)

  def _adapters(self, x_TxI, in_shape, deterministic: bool):
    """LoRA's (alpha / r) dropout(x) A B: A [in..., R] random, B [R, out...] zeros (so the
    layer starts as the base one), each with its side's logical axes; the rank unsharded."""
    cfg, rank, num_in = self.cfg, self.cfg.lora_rank, len(in_shape)
    a_init = nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform",
                                              in_axis=tuple(range(num_in)), out_axis=-1)
    a_axes = self.kernel_axes[:num_in] + (None,)
    a = self.param("lora_a", nn.with_logical_partitioning(a_init, a_axes), in_shape + (rank,),
                   dtype_of(cfg.param_dtype))
    b = self.param("lora_b", zeros_init((None,) + self.kernel_axes[num_in:]),
                   (rank,) + self.features, dtype_of(cfg.param_dtype))
    dtype = dtype_of(cfg.dtype)
    if cfg.lora_dropout:
      x_TxI = nn.Dropout(cfg.lora_dropout)(x_TxI, deterministic=deterministic)
    h_TxR = x_TxI @ a.astype(dtype).reshape(-1, rank)
    return (h_TxR * cfg.lora_scale) @ b.astype(dtype).reshape(rank, -1)


def dense(cfg: EncoderConfig, features: int | tuple[int, ...], *,
          kernel_axes: Sequence[str | None], axis: int | tuple[int, ...] = -1,
          use_bias: bool | None = None, name: str | None = None, lora: bool = False) -> Dense:
  """A Dense layer whose kernel and bias carry logical axis names.

  `kernel_axes` names the input axes then the output axes; the bias takes the
  output ones. `lora`: with adapters when cfg.lora_rank > 0.
  """
  features = (features,) if isinstance(features, int) else tuple(features)
  axis = (axis,) if isinstance(axis, int) else tuple(axis)
  return Dense(features, axis, tuple(kernel_axes),
               cfg.use_bias if use_bias is None else use_bias, cfg, lora, name=name)


def norm(cfg: EncoderConfig, name: str | None = None) -> nn.Module:
  """LayerNorm (bias per `cfg.norm_bias`) or RMSNorm over the model axis (statistics in
  float32)."""
  scale_init = nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",))
  common = dict(epsilon=cfg.norm_eps, dtype=dtype_of(cfg.dtype),
                param_dtype=dtype_of(cfg.param_dtype), scale_init=scale_init, name=name)
  if cfg.norm == "rmsnorm":
    return nn.RMSNorm(**common)
  return nn.LayerNorm(use_bias=cfg.norm_bias, bias_init=zeros_init(("embed",)), **common)


def take_rows(x, rows_BxQ: jax.Array, axis: int = 1) -> jax.Array:
  """Selects Q rows per batch element along `axis`: [B, ..., L, ...] -> [B, ..., Q, ...]."""
  shape = [1] * x.ndim
  shape[0], shape[axis] = rows_BxQ.shape
  return jnp.take_along_axis(x, rows_BxQ.reshape(shape), axis=axis)


def constrain(x_BxLxD: jax.Array) -> jax.Array:
  """Marks a [B, L, D] activation's sharding by logical names (no-op without rules)."""
  return nn.with_logical_constraint(x_BxLxD, ACT_BLD)
