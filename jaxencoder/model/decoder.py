"""The decoder (causal self-attention, cross-attention to an encoder's outputs, feed-forward),
the encoder-decoder model, and greedy decoding with a fixed-shape key / value cache (kept by
the decoder's self-attention)."""

from __future__ import annotations

import functools

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.model.attention import AttentionLayer, KernelCall
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.embeddings import Embeddings
from jaxencoder.model.encoder import (EMBEDDINGS, SCANNED_LAYERS, Encoder, block_class, layer_name,
                                scanned_blocks)
from jaxencoder.model.ffn import FeedForward
from jaxencoder.model.flash import AttentionPlan, plan_attention
from jaxencoder.model.heads import MlmHead
from jaxencoder.model.layers import constrain, norm
from jaxencoder.model.masks import make_attention_mask, make_cache_mask
from jaxencoder.model.positions import RelativePositionBias, apply_rope

DECODER = "decoder"  # where EncoderDecoder holds the Decoder (the Encoder: encoder.ENCODER)
LM_HEAD = "lm_head"  # the Decoder's output head, tied to its token embedding


def decoder_config(cfg: EncoderConfig, **overrides) -> EncoderConfig:
  """A decoder's config from an encoder's: the same sizes, norms, positions, attention,
  remat and scan options; token ids in, causal, no token types."""
  return cfg.replace(**{"input_kind": "text", "causal": True, "type_vocab_size": 0,
                        **overrides})


@flax.struct.dataclass
class DecoderInputs:
  """What every decoder block of one call shares (static flags in the tree structure, as
  encoder.BlockInputs). T: decoder length; S: encoder length. While decoding from the
  cache the self-attention keys are its M rows: `mask_Bx1xTxT` is [B, 1, T, M]."""
  mask_Bx1xTxT: jax.Array | None
  bias_BxHxTxT: jax.Array | None
  key_mask_BxT: jax.Array
  positions_BxT: jax.Array
  memory_BxSxD: jax.Array
  memory_key_mask_BxS: jax.Array
  cache_index: jax.Array | None  # decoding: the cache row of this call's first token
  deterministic: bool = flax.struct.field(pytree_node=False)
  decode: bool = flax.struct.field(pytree_node=False)
  attention: AttentionPlan = flax.struct.field(pytree_node=False, default=AttentionPlan("xla"))
  cross_attention: AttentionPlan = flax.struct.field(pytree_node=False,
                                                     default=AttentionPlan("xla"))

  @property
  def memory_mask_Bx1x1xS(self) -> jax.Array:
    return self.memory_key_mask_BxS.astype(bool)[:, None, None, :]


class DecoderSelfAttention(AttentionLayer):
  """Causal self-attention over the decoder's tokens, run by the kernel `inputs.attention`
  names. Decoding (`inputs.decode`), keys and values go through a fixed-shape cache
  (`_cached`) and the mask covers its rows; only `xla` and `fused` serve that."""

  @nn.compact
  def __call__(self, x_BxTxD, inputs: DecoderInputs):
    cfg, plan, det = self.cfg, inputs.attention, inputs.deterministic
    if inputs.decode and not plan.needs_dense_mask:
      raise ValueError(f"cached decoding runs 'xla' or 'fused', not {plan.impl!r}")
    q_BxTxHxK = self.heads("query", x_BxTxD, det)
    k_BxTxHxK = self.heads("key", x_BxTxD, det)
    v_BxTxHxK = self.heads("value", x_BxTxD, det)
    if cfg.position_embedding == "rope":  # no local layers here: rope_base everywhere
      rope = lambda x_BxTxHxK: apply_rope(x_BxTxHxK, inputs.positions_BxT, cfg.rope_base,
                                          cfg.rope_scaling)
      q_BxTxHxK, k_BxTxHxK = rope(q_BxTxHxK), rope(k_BxTxHxK)
    if inputs.decode:  # keys and values: the cache's M rows
      k_BxTxHxK, v_BxTxHxK = self._cached(k_BxTxHxK, v_BxTxHxK, inputs.cache_index)
    call = KernelCall(inputs.mask_Bx1xTxT, inputs.bias_BxHxTxT, inputs.key_mask_BxT, cfg.causal,
                      cfg.sliding_window, self.weights_dropout(det), interpret=plan.interpret)
    out_BxTxHxK, _ = plan.kernel(q_BxTxHxK, k_BxTxHxK, v_BxTxHxK, call)
    return self.merge_heads(out_BxTxHxK, det)

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


class CrossAttention(AttentionLayer):
  """The decoder reading an encoder's outputs: queries from its tokens [B, T, D], keys and
  values from `inputs.memory_BxSxD` (padding `memory_key_mask_BxS`, mask [B, 1, 1, S]).
  No RoPE: the two sequences' positions are not comparable. Only `xla` and `fused` serve it."""

  @nn.compact
  def __call__(self, x_BxTxD, inputs: DecoderInputs):
    plan, det = inputs.cross_attention, inputs.deterministic
    if not plan.needs_dense_mask:
      raise ValueError(f"cross-attention runs 'xla' or 'fused', not {plan.impl!r}")
    q_BxTxHxK = self.heads("query", x_BxTxD, det)
    k_BxSxHxK = self.heads("key", inputs.memory_BxSxD, det)
    v_BxSxHxK = self.heads("value", inputs.memory_BxSxD, det)
    call = KernelCall(inputs.memory_mask_Bx1x1xS, None, inputs.memory_key_mask_BxS,
                      dropout=self.weights_dropout(det), interpret=plan.interpret)
    out_BxTxHxK, _ = plan.kernel(q_BxTxHxK, k_BxSxHxK, v_BxSxHxK, call)
    return self.merge_heads(out_BxTxHxK, det)


class DecoderBlock(nn.Module):
  """Causal self-attention, cross-attention to the encoder's outputs, feed-forward; each a
  residual sub-layer, post-norm (BERT) or pre-norm as the config says. Returns (x, None)."""
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, x_BxTxD, inputs: DecoderInputs):
    cfg, pre, det = self.cfg, self.cfg.norm_position == "pre", inputs.deterministic

    def residual(x_BxTxD, name, layer):
      h_BxTxD = norm(cfg, name=f"{name}_norm")(x_BxTxD) if pre else x_BxTxD
      x_BxTxD = x_BxTxD + nn.Dropout(cfg.dropout_rate)(layer(h_BxTxD), deterministic=det)
      return x_BxTxD if pre else norm(cfg, name=f"{name}_norm")(x_BxTxD)

    self_attention = lambda h_BxTxD: DecoderSelfAttention(cfg, name="attention")(h_BxTxD, inputs)
    cross_attention = lambda h_BxTxD: CrossAttention(cfg, name="cross_attention")(h_BxTxD, inputs)
    feed_forward = lambda h_BxTxD: FeedForward(cfg, name="ffn")(h_BxTxD, deterministic=det)
    x_BxTxD = residual(x_BxTxD, "attention", self_attention)
    x_BxTxD = residual(x_BxTxD, "cross_attention", cross_attention)
    x_BxTxD = residual(x_BxTxD, "ffn", feed_forward)
    return constrain(x_BxTxD), None


class Decoder(nn.Module):
  """Transformer decoder: token ids [B, T] -> next-token logits [B, T, V], attending
  causally to itself and to an encoder's outputs `memory_BxSxD` (padding `memory_mask_BxS`).

  Embeddings, positions, norms, remat and the loop / nn.scan stack follow `cfg` (a
  `decoder_config`) as in the Encoder; the LM head (heads.MlmHead) is tied to the token
  embedding: the decoder's own, or `token_table_VxD` (an encoder's) when given.
  Self-attention runs the kernel `plan_attention` picks, cross-attention `xla` (`fused`
  when asked). `decode=True` keeps each layer's keys and values in a fixed-shape cache
  ('cache' collection, see `init_cache`): the first call creates it for its own length T,
  every later call appends its tokens.
  """
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, ids_BxT, memory_BxSxD, memory_mask_BxS=None, mask_BxT=None, *,
               deterministic: bool = True, decode: bool = False, token_table_VxD=None):
    cfg = self.cfg
    if not cfg.causal or cfg.input_kind != "text":
      raise ValueError("Decoder needs a causal text config: decoder_config(encoder_cfg)")
    if mask_BxT is None:
      mask_BxT = jnp.ones(ids_BxT.shape, jnp.int32)
    if memory_mask_BxS is None:
      memory_mask_BxS = jnp.ones(memory_BxSxD.shape[:2], jnp.int32)
    cache_index, written_BxM = self._cache_state(mask_BxT) if decode else (None, None)
    positions_BxT = None
    if cache_index is not None:
      positions_BxT = cache_index + jnp.broadcast_to(jnp.arange(ids_BxT.shape[1]), ids_BxT.shape)
    embed = Embeddings(cfg, name=EMBEDDINGS)
    x_BxTxD, mask_BxT, _, positions_BxT = embed(ids_BxT, mask_BxT, None, None, positions_BxT,
                                                deterministic=deterministic,
                                                token_table_VxD=token_table_VxD)
    inputs = self._block_inputs(mask_BxT, positions_BxT, memory_BxSxD, memory_mask_BxS,
                                cache_index, written_BxM, deterministic, decode)
    x_BxTxD = self._stack(constrain(x_BxTxD), inputs)
    if cfg.norm_position == "pre":
      x_BxTxD = norm(cfg, name="final_norm")(x_BxTxD)
    if token_table_VxD is None:
      token_table_VxD = nn.meta.unbox(embed.variables["params"]["token_embed"]["embedding"])
    return MlmHead(cfg, name=LM_HEAD)(x_BxTxD, token_table_VxD)

  def _cache_state(self, mask_BxT):
    """Decoding: (cache row of this call's first token, which of the M cache rows hold keys
    [B, M]). The first call creates the cache (M = its length T) and gets (None, None)."""
    creating = not self.has_variable("cache", "index")
    index = self.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    written = self.variable("cache", "key_mask", jnp.zeros, mask_BxT.shape, jnp.int32)
    if creating:
      return None, None
    start = index.value
    written.value = jax.lax.dynamic_update_slice(written.value, mask_BxT.astype(jnp.int32),
                                                 (jnp.zeros_like(start), start))
    index.value = start + mask_BxT.shape[1]
    return start, written.value

  def _block_inputs(self, mask_BxT, positions_BxT, memory_BxSxD, memory_mask_BxS,
                    cache_index, written_BxM, deterministic, decode) -> DecoderInputs:
    """Masks, position bias and attention plans for one call: over the cache's rows when
    decoding from it, else causal over this call's tokens."""
    cfg = self.cfg
    stepping = cache_index is not None
    key_positions_BxM = positions_BxT
    if stepping:
      plan = plan_attention(cfg, decode=True)
      key_positions_BxM = jnp.broadcast_to(jnp.arange(written_BxM.shape[1]), written_BxM.shape)
      mask = make_cache_mask(written_BxM, positions_BxT, sliding_window=cfg.sliding_window)
    else:
      plan = plan_attention(
          cfg, dropout_active=not deterministic and cfg.attention_dropout_rate > 0,
          has_bias=cfg.position_embedding == "relative", decode=decode)
      mask = None
      if plan.needs_dense_mask:
        mask = make_attention_mask(mask_BxT, causal=True, sliding_window=cfg.sliding_window)
    bias = None
    if cfg.position_embedding == "relative":
      bias = RelativePositionBias(cfg, name="relative_bias")(positions_BxT, key_positions_BxM)
    cross = plan_attention(cfg, cross=True,
                           dropout_active=not deterministic and cfg.attention_dropout_rate > 0)
    return DecoderInputs(mask, bias, mask_BxT, positions_BxT, memory_BxSxD, memory_mask_BxS,
                         cache_index, deterministic, decode, plan, cross)

  def _stack(self, x_BxTxD, inputs: DecoderInputs):
    """The N blocks, looped or under nn.scan; rematerialised when training (not decoding)."""
    cfg = self.cfg
    block = DecoderBlock if inputs.decode else block_class(cfg, cfg.scan_layers, DecoderBlock)
    if cfg.scan_layers:
      x_BxTxD, _ = scanned_blocks(cfg, cfg.num_layers, block)(cfg, name=SCANNED_LAYERS)(
          x_BxTxD, inputs)
      return x_BxTxD
    for i in range(cfg.num_layers):
      x_BxTxD, _ = block(cfg, name=layer_name(i))(x_BxTxD, inputs)
    return x_BxTxD


def memory_mask(cfg: EncoderConfig, attention_mask_BxL, memory_BxSxD):
  """Padding [B, S] of an encoder's outputs: its input mask, with a leading 1 for the [CLS]
  vector that image and series inputs gain."""
  if attention_mask_BxL is None:
    return jnp.ones(memory_BxSxD.shape[:2], jnp.int32)
  if attention_mask_BxL.shape[1] == memory_BxSxD.shape[1]:
    return attention_mask_BxL
  ones_Bx1 = jnp.ones((attention_mask_BxL.shape[0], 1), attention_mask_BxL.dtype)
  return jnp.concatenate([ones_Bx1, attention_mask_BxL], axis=1)


class EncoderDecoder(nn.Module):
  """Encoder + Decoder: the encoder's outputs are the keys and values of the decoder's
  cross-attention. The encoder is the plain `Encoder` under `encoder.ENCODER`, so a
  trained model's encoder loads into the other heads (`init_from`) and into probing.

  `__call__(inputs, attention_mask, token_type_ids, segment_ids, positions,
  decoder_input_ids, decoder_mask)` -> logits [B, T, V] (teacher forcing: the decoder
  reads the targets shifted right, [BOS] first). `encode` and `decode` are the two halves
  (`greedy_decode` calls them). `decoder_cfg` defaults to `decoder_config(cfg)`.
  `share_embeddings` (text encoders): the decoder embeds with the encoder's token table and
  its LM head is tied to it (T5, BART), so a word the decoder was never trained to write
  is still the vector the encoder reads.
  """
  cfg: EncoderConfig
  decoder_cfg: EncoderConfig | None = None
  share_embeddings: bool = True

  def setup(self):
    self.encoder = Encoder(self.cfg)  # the attribute name is the param name: ENCODER
    self.decoder = Decoder(self.decoder_cfg or decoder_config(self.cfg))

  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, decoder_input_ids=None, decoder_mask=None, *,
               deterministic: bool = True):
    if decoder_input_ids is None:
      raise ValueError("EncoderDecoder needs decoder_input_ids [B, T] (the targets shifted "
                       "right, [BOS] first)")
    memory_BxSxD, memory_mask_BxS = self.encode(inputs, attention_mask, token_type_ids,
                                                segment_ids, positions,
                                                deterministic=deterministic)
    return self.decode(decoder_input_ids, memory_BxSxD, memory_mask_BxS, decoder_mask,
                       deterministic=deterministic)

  def encode(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
             positions=None, *, deterministic: bool = True):
    """(encoder outputs [B, S, D], their padding mask [B, S])."""
    if segment_ids is not None:
      raise ValueError("EncoderDecoder does not take packed rows (segment_ids)")
    out = self.encoder(inputs, attention_mask, token_type_ids, None, positions,
                       deterministic=deterministic)
    return out.last_hidden_state, memory_mask(self.cfg, attention_mask, out.last_hidden_state)

  def decode(self, decoder_input_ids, memory_BxSxD, memory_mask_BxS, decoder_mask=None, *,
             deterministic: bool = True, decode: bool = False):
    """Logits [B, T, V] of the decoder over the encoder outputs `memory_BxSxD`."""
    return self.decoder(decoder_input_ids, memory_BxSxD, memory_mask_BxS, decoder_mask,
                        deterministic=deterministic, decode=decode,
                        token_table_VxD=self._shared_table())

  def _shared_table(self):
    """The encoder's token embedding [V, D] when the decoder shares it, else None."""
    if not self.share_embeddings or self.cfg.input_kind != "text":
      return None
    dec = self.decoder.cfg
    if (dec.vocab_size, dec.emb_dim) != (self.cfg.vocab_size, self.cfg.emb_dim):
      raise ValueError(f"share_embeddings: the decoder's vocab_size x emb_dim {dec.vocab_size} "
                       f"x {dec.emb_dim} differs from the encoder's {self.cfg.vocab_size} x "
                       f"{self.cfg.emb_dim}")
    table = self.encoder.variables["params"][EMBEDDINGS]["token_embed"]["embedding"]
    return nn.meta.unbox(table)


def init_cache(model: EncoderDecoder, params, memory_BxSxD, memory_mask_BxS, max_len: int):
  """A zero key / value cache for `max_len` decoding steps: per layer [B, max_len, H, K]
  keys and values, which rows hold keys, and the next row (shapes from an abstract call)."""
  def create(params, memory_BxSxD, memory_mask_BxS):
    ids_BxT = jnp.zeros((memory_BxSxD.shape[0], max_len), jnp.int32)
    _, variables = model.apply({"params": params}, ids_BxT, memory_BxSxD, memory_mask_BxS,
                               decode=True, method=EncoderDecoder.decode, mutable=["cache"])
    return variables["cache"]
  shapes = jax.eval_shape(create, params, memory_BxSxD, memory_mask_BxS)
  return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)


@functools.partial(jax.jit, static_argnames=("model", "max_len", "eos_id"))
def greedy_decode(model: EncoderDecoder, params, inputs, attention_mask, max_len: int,
                  bos_id, eos_id: int | None = None, token_type_ids=None):
  """Greedy decoding under jit with fixed shapes: tokens [B, max_len].

  Encodes once, then feeds one token per step through the decoder's key / value cache
  (`init_cache`); each row starts from `bos_id` (an int or [B] ids). With `eos_id`, a
  row's tokens after its first `eos_id` are 0 and the loop ends once every row has one.
  """
  memory_BxSxD, memory_mask_BxS = model.apply(
      {"params": params}, inputs, attention_mask, token_type_ids, method=EncoderDecoder.encode)
  batch = memory_BxSxD.shape[0]

  def step(carry):
    t, last_B, tokens_BxT, done_B, cache = carry
    logits_Bx1xV, variables = model.apply(
        {"params": params, "cache": cache}, last_B[:, None], memory_BxSxD, memory_mask_BxS,
        decode=True, method=EncoderDecoder.decode, mutable=["cache"])
    next_B = jnp.argmax(logits_Bx1xV[:, 0], axis=-1).astype(jnp.int32)
    if eos_id is not None:
      next_B = jnp.where(done_B, 0, next_B)
      done_B = done_B | (next_B == eos_id)
    tokens_BxT = jax.lax.dynamic_update_slice(tokens_BxT, next_B[:, None], (0, t))
    return t + 1, next_B, tokens_BxT, done_B, variables["cache"]

  def running(carry):
    t, _, _, done_B, _ = carry
    return (t < max_len) & ~jnp.all(done_B)

  start = (jnp.zeros((), jnp.int32), jnp.broadcast_to(jnp.asarray(bos_id, jnp.int32), (batch,)),
           jnp.zeros((batch, max_len), jnp.int32), jnp.zeros((batch,), bool),
           init_cache(model, params, memory_BxSxD, memory_mask_BxS, max_len))
  return jax.lax.while_loop(running, step, start)[2]
