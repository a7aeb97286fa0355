"""ELECTRA (Clark et al. 2020): replaced-token detection.

A small MLM generator fills the masked positions with samples; the discriminator, a
full-size Encoder, labels every token original or replaced. The discriminator sits under
the param name `encoder` (ENCODER), so checkpoints, `init_from`, probing and the BERT
export see it as the encoder, with no special case.

Param tree: encoder (the discriminator), discriminator_head, generator, generator_head.

Shared embeddings: the generator reads the discriminator's token table [V, E] (E = the
discriminator's width). Its input is the looked-up token vectors, which its front end
(a "series" Encoder: dense E -> D_g, then its own positions, types and norm) projects to
its width D_g; its MLM head maps D_g back to E for logits against the same table. Only
the token table is shared: the paper found tied token embeddings give most of the gain.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import EMBEDDINGS, Encoder
from jaxencoder.model.ffn import ACTIVATIONS
from jaxencoder.model.heads import MlmHead
from jaxencoder.model.layers import dense, dtype_of, take_rows

GENERATOR_SCALE = 0.25  # generator width, heads and FFN / the discriminator's (ELECTRA-Small)


def generator_config(cfg: EncoderConfig, scale: float = GENERATOR_SCALE) -> EncoderConfig:
  """The generator of a discriminator `cfg`: same depth, `scale` x its width, heads and
  FFN, over E-wide token vectors (input_kind "series", no [CLS] vector of its own)."""
  if cfg.input_kind != "text":
    raise ValueError(f"ELECTRA replaces tokens: input_kind must be 'text', got {cfg.input_kind!r}")
  heads = max(1, round(cfg.num_heads * scale))
  width = max(heads, round(cfg.emb_dim * scale))
  if width % heads:
    raise ValueError(f"generator width {width} (emb_dim x {scale}) is not divisible by its "
                     f"{heads} heads; choose another scale")
  return cfg.replace(input_kind="series", input_features=cfg.embedding_dim or cfg.emb_dim,
                     embedding_dim=None, use_cls_token=False,
                     emb_dim=width, num_heads=heads, head_dim=None,
                     mlp_dim=max(1, round(cfg.resolved_mlp_dim * scale)),
                     pooling="mean", pooler_dense=False, scale_embeddings=False)


class DiscriminatorHead(nn.Module):
  """Per-token replaced-vs-original logit: dense + act, then dense to one: [B, L, D] -> [B, L]."""
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxD):
    cfg = self.cfg
    act = ACTIVATIONS["gelu" if cfg.activation in ("swiglu", "geglu") else cfg.activation]
    h_BxLxD = act(dense(cfg, cfg.emb_dim, kernel_axes=("embed", None), name="transform")(x_BxLxD))
    logit_BxLx1 = dense(cfg, 1, kernel_axes=(None, None), name="classifier")(h_BxLxD)
    return logit_BxLx1[..., 0].astype(jnp.float32)


class Electra(nn.Module):
  """Generator + discriminator for a discriminator config `cfg` (text input).

  `generate(...)` -> generator logits [B, M, V] at `masked_positions` [B, M] (or [B, L, V]);
  `discriminate(...)` -> replaced logits [B, L]. Sampling between the two is the loss's
  (`replace_tokens`); calling the module runs both on the same ids (for init).
  """
  cfg: EncoderConfig
  generator_scale: float = GENERATOR_SCALE

  def setup(self):
    self.encoder = Encoder(self.cfg)  # the discriminator; the attribute name is ENCODER
    self.discriminator_head = DiscriminatorHead(self.cfg)
    self.generator = Encoder(generator_config(self.cfg, self.generator_scale))
    self.generator_head = MlmHead(self.cfg)

  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, *, deterministic: bool = True):
    # The discriminator first: it creates the token table the generator reads.
    replaced_BxL = self.discriminate(inputs, attention_mask, token_type_ids, segment_ids,
                                     positions, deterministic=deterministic)
    return self.generate(inputs, attention_mask, token_type_ids, segment_ids, positions,
                         deterministic=deterministic), replaced_BxL

  def generate(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, masked_positions=None, *, deterministic: bool = True):
    """Generator logits [B, M, V] at `masked_positions` [B, M], else [B, L, V].

    `positions` is not passed on: the generator numbers its tokens 0..L-1, or per
    segment from `segment_ids` (the same numbers for packed rows).
    """
    del positions
    if token_type_ids is None and self.cfg.type_vocab_size:  # type 0, as text encoders assume
      token_type_ids = jnp.zeros(inputs.shape, jnp.int32)  # (a series encoder would skip types)
    table_VxE = nn.meta.unbox(
        self.encoder.variables["params"][EMBEDDINGS]["token_embed"]["embedding"])
    tokens_BxLxE = jnp.take(table_VxE, inputs, axis=0).astype(dtype_of(self.cfg.dtype))
    out = self.generator(tokens_BxLxE, attention_mask, token_type_ids, segment_ids,
                         deterministic=deterministic, output_positions=masked_positions)
    return self.generator_head(out.last_hidden_state, table_VxE)

  def discriminate(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
                   positions=None, *, deterministic: bool = True):
    """Replaced-token logits [B, L] (> 0: replaced)."""
    out = self.encoder(inputs, attention_mask, token_type_ids, segment_ids, positions,
                       deterministic=deterministic)
    return self.discriminator_head(out.last_hidden_state)


def replace_tokens(key: jax.Array, logits_BxMxV: jax.Array, original_BxL: jax.Array,
                   weights_BxM: jax.Array, positions_BxM: jax.Array | None = None
                   ) -> tuple[jax.Array, jax.Array]:
  """Samples a token (temperature 1) at each predicted position (weight > 0) and writes
  it over the original ids. Returns (corrupted ids [B, L], replaced [B, L] in {0, 1}).

  No gradient flows through the draw: the logits are stop_gradient'ed and the sample is
  an integer. A sample equal to the original counts as original, as in ELECTRA.
  `positions_BxM` None: the logits cover every position (M = L).
  """
  sampled_BxM = jax.random.categorical(key, jax.lax.stop_gradient(logits_BxMxV), axis=-1)
  if positions_BxM is None:
    positions_BxM = jnp.broadcast_to(jnp.arange(original_BxL.shape[1]), original_BxL.shape)
  kept_BxM = take_rows(original_BxL, positions_BxM)
  new_BxM = jnp.where(weights_BxM > 0, sampled_BxM.astype(original_BxL.dtype), kept_BxM)
  rows_Bx1 = jnp.arange(original_BxL.shape[0])[:, None]
  corrupted_BxL = original_BxL.at[rows_Bx1, positions_BxM].set(new_BxM)
  return corrupted_BxL, (corrupted_BxL != original_BxL).astype(jnp.float32)

