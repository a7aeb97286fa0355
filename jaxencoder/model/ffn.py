"""Position-wise feed-forward block: D -> F -> D, plain or gated."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax

from jaxencoder.model.config import GATED_ACTIVATIONS as GATED, EncoderConfig
from jaxencoder.model.layers import dense

ACTIVATIONS = {
    "gelu": functools.partial(jax.nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
    "relu": jax.nn.relu,
    "swiglu": jax.nn.silu,
    "geglu": functools.partial(jax.nn.gelu, approximate=False),
}


class FeedForward(nn.Module):
  """wo(act(wi(x))) or, for gated activations, wo(act(wi_gate(x)) * wi_up(x))."""
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxD, *, deterministic: bool):
    cfg = self.cfg
    act = ACTIVATIONS[cfg.activation]
    adapts = lambda name: cfg.lora_adapts(f"{self.name or 'ffn'}/{name}/kernel")
    up = lambda name: dense(cfg, cfg.resolved_mlp_dim, kernel_axes=("embed", "mlp"), name=name,
                            lora=adapts(name))(x_BxLxD, deterministic=deterministic)
    if cfg.activation in GATED:
      h_BxLxF = act(up("wi_gate")) * up("wi_up")
    else:
      h_BxLxF = act(up("wi"))
    h_BxLxF = nn.with_logical_constraint(h_BxLxF, ("act_batch", "act_len", "act_mlp"))
    if cfg.mlp_dropout_rate > 0:
      h_BxLxF = nn.Dropout(cfg.mlp_dropout_rate)(h_BxLxF, deterministic=deterministic)
    return dense(cfg, cfg.emb_dim, kernel_axes=("mlp", "embed"), name="wo", lora=adapts("wo"))(
        h_BxLxF, deterministic=deterministic)
