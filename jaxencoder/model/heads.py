"""Task heads on top of the encoder, the encoder + head models the tasks train
(jaxencoder/tasks/), and the contrastive loss.

Heads are separate modules so a checkpoint's encoder can meet a new head.
"""

from __future__ import annotations

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import EMBEDDINGS, Encoder, EncoderOutput
from jaxencoder.model.ffn import ACTIVATIONS
from jaxencoder.model.layers import dense, dtype_of, norm, take_rows, zeros_init


def vocab_logits(h_BxLxE: jax.Array, table_VxE: jax.Array, bias_V: jax.Array) -> jax.Array:
  """Logits [B, L, V] (float32) of hidden states [B, L, E] against the tied token table +
  bias: MlmHead's one vocabulary projection, of all its rows or of a chunk of them."""
  logits_BxLxV = jnp.einsum("ble,ve->blv", h_BxLxE, table_VxE.astype(h_BxLxE.dtype),
                            preferred_element_type=jnp.float32)
  return logits_BxLxV + bias_V[None, None, :]


@flax.struct.dataclass
class VocabProjection:
  """MlmHead's output before the vocabulary: what `vocab_logits` projects. A pytree, so
  a loss can project it a chunk at a time (tasks/base.chunked_weighted_ce) and never
  hold all the [B, L, V] logits and their gradient."""
  hidden_BxLxE: jax.Array  # after the head's dense + act + norm
  table_VxE: jax.Array  # the tied token embedding
  bias_V: jax.Array

  def logits(self) -> jax.Array:
    return vocab_logits(self.hidden_BxLxE, self.table_VxE, self.bias_V)


class MlmHead(nn.Module):
  """BERT's MLM head: dense + act + norm, then logits against the tied embedding + bias."""
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxD, embedding_VxD, masked_positions_BxM=None, *,
               project: bool = True):
    """Logits [B, L, V], or [B, M, V] at `masked_positions_BxM` only; project=False:
    the VocabProjection they come from (the same params, no logits computed)."""
    cfg = self.cfg
    if masked_positions_BxM is not None:
      x_BxLxD = take_rows(x_BxLxD, masked_positions_BxM)
    act = ACTIVATIONS["gelu" if cfg.activation in ("swiglu", "geglu") else cfg.activation]
    width = embedding_VxD.shape[-1]  # emb_dim, or embedding_dim (ELECTRA's E)
    h_BxLxE = act(dense(cfg, width, kernel_axes=("embed", None), name="transform")(x_BxLxD))
    h_BxLxE = norm(cfg, name="norm")(h_BxLxE)
    bias_V = self.param("bias", zeros_init(("vocab",)), (cfg.vocab_size,),
                        dtype_of(cfg.param_dtype))
    projection = VocabProjection(h_BxLxE, embedding_VxD, bias_V)
    return projection.logits() if project else projection


class EncoderForMaskedLM(nn.Module):
  """Encoder + MlmHead with the decoder tied to `embeddings/token_embed`.

  Returns (logits, EncoderOutput); logits are [B, M, V] when `masked_positions`
  [B, M] are given, which skips the vocabulary projection (and most of the last
  block, see Encoder's `output_positions`) elsewhere; the EncoderOutput's
  last_hidden_state is then [B, M, D] too. project=False: the head's VocabProjection
  in place of the logits (a loss that projects it in chunks). `encoder_options`: the
  Encoder's ProbeOptions (output_hidden_states, output_attentions, output_head_outputs,
  head_mask, interventions).
  """
  cfg: EncoderConfig

  def setup(self):
    self.encoder = Encoder(self.cfg)  # the attribute name is the param name: ENCODER
    self.mlm_head = MlmHead(self.cfg)

  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, masked_positions=None, *, deterministic: bool = True,
               project: bool = True, **encoder_options):
    out: EncoderOutput = self.encoder(
        inputs, attention_mask, token_type_ids, segment_ids, positions,
        deterministic=deterministic, output_positions=masked_positions, **encoder_options)
    table = self.encoder.variables["params"][EMBEDDINGS]["token_embed"]["embedding"]
    embedding_VxD = nn.meta.unbox(table)
    return self.mlm_head(out.last_hidden_state, embedding_VxD, project=project), out


class EncoderForPreTraining(nn.Module):
  """BERT's pre-training model: EncoderForMaskedLM plus a 2-way sentence-pair head (next
  sentence or sentence order) on the pooled [CLS] vector (BERT pools with pooler_dense).

  Returns (MLM logits [B, M or L, V], pair logits [B, 2], EncoderOutput); project=False:
  the MLM head's VocabProjection in place of its logits.
  """
  cfg: EncoderConfig

  def setup(self):
    self.encoder = Encoder(self.cfg)
    self.mlm_head = MlmHead(self.cfg)
    self.pair_head = SequenceClassificationHead(self.cfg, 2)

  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, masked_positions=None, *, deterministic: bool = True,
               project: bool = True):
    out: EncoderOutput = self.encoder(
        inputs, attention_mask, token_type_ids, segment_ids, positions,
        deterministic=deterministic, output_positions=masked_positions)
    table = self.encoder.variables["params"][EMBEDDINGS]["token_embed"]["embedding"]
    mlm = self.mlm_head(out.last_hidden_state, nn.meta.unbox(table), project=project)
    return mlm, self.pair_head(out.pooled, deterministic=deterministic), out


class SequenceClassificationHead(nn.Module):
  """Dropout + dense on the pooled vector: [B, D] -> [B, C]."""
  cfg: EncoderConfig
  num_classes: int

  @nn.compact
  def __call__(self, pooled_BxD, *, deterministic: bool = True):
    x_BxD = nn.Dropout(self.cfg.dropout_rate)(pooled_BxD, deterministic=deterministic)
    return dense(self.cfg, self.num_classes, kernel_axes=("embed", None), name="classifier")(x_BxD)


class TokenClassificationHead(nn.Module):
  """Dropout + dense per token: [B, L, D] -> [B, L, C]."""
  cfg: EncoderConfig
  num_classes: int

  @nn.compact
  def __call__(self, x_BxLxD, *, deterministic: bool = True):
    x_BxLxD = nn.Dropout(self.cfg.dropout_rate)(x_BxLxD, deterministic=deterministic)
    return dense(self.cfg, self.num_classes, kernel_axes=("embed", None), name="classifier")(x_BxLxD)


class ContrastiveHead(nn.Module):
  """Projection of pooled vectors for contrastive learning: [B, D] -> unit [B, P]."""
  cfg: EncoderConfig
  projection_dim: int = 128

  @nn.compact
  def __call__(self, pooled_BxD):
    h_BxD = jax.nn.gelu(dense(self.cfg, self.cfg.emb_dim, kernel_axes=("embed", None),
                              name="hidden")(pooled_BxD))
    z_BxP = dense(self.cfg, self.projection_dim, kernel_axes=(None, None), name="projection")(h_BxD)
    return l2_normalize(z_BxP)


def l2_normalize(x: jax.Array, eps: float = 1e-12) -> jax.Array:
  x = x.astype(jnp.float32)
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def cosine_similarity(a_BxD: jax.Array, b_BxD: jax.Array) -> jax.Array:
  """Row-wise cosine similarity: [B]."""
  return jnp.sum(l2_normalize(a_BxD) * l2_normalize(b_BxD), axis=-1)


def info_nce_loss(a_BxP: jax.Array, b_BxP: jax.Array, temperature: float = 0.05,
                  symmetric: bool = True) -> jax.Array:
  """InfoNCE with in-batch negatives: row i of `a` should match row i of `b`.

  Cosine logits / temperature; cross-entropy against the diagonal, averaged over
  both directions when `symmetric`.
  """
  logits_BxB = l2_normalize(a_BxP) @ l2_normalize(b_BxP).T / temperature
  labels_B = jnp.arange(logits_BxB.shape[0])
  loss = optax.softmax_cross_entropy_with_integer_labels(logits_BxB, labels_B).mean()
  if symmetric:
    loss_t = optax.softmax_cross_entropy_with_integer_labels(logits_BxB.T, labels_B).mean()
    loss = (loss + loss_t) / 2
  return loss


class EncoderClassifier(nn.Module):
  """Encoder + a sequence head on the pooled vector, or a token head on every position.
  `head_mask` and `interventions` reach the Encoder (a study of what the classifier uses)."""
  cfg: EncoderConfig
  num_classes: int
  token_level: bool = False

  def setup(self):
    self.encoder = Encoder(self.cfg)
    head_cls = TokenClassificationHead if self.token_level else SequenceClassificationHead
    self.head = head_cls(self.cfg, self.num_classes)

  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, *, deterministic: bool = True, head_mask=None,
               interventions=None):
    out = self.encoder(inputs, attention_mask, token_type_ids, segment_ids, positions,
                       deterministic=deterministic, head_mask=head_mask,
                       interventions=interventions)
    features = out.last_hidden_state if self.token_level else out.pooled
    return self.head(features, deterministic=deterministic)


class EncoderContrastive(nn.Module):
  """Encoder + projection to unit vectors: [B, P], or [B, K, P] for groups of K texts
  [B, K, L] (supervised pairs: text, positive[, hard negative]). projection_dim 0: no
  head, the pooled vectors themselves normalised (P = D: what retrieval uses)."""
  cfg: EncoderConfig
  projection_dim: int = 128

  def setup(self):
    self.encoder = Encoder(self.cfg)
    self.head = (ContrastiveHead(self.cfg, self.projection_dim) if self.projection_dim
                 else l2_normalize)

  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, *, deterministic: bool = True):
    args, groups = (inputs, attention_mask, token_type_ids, segment_ids, positions), None
    if is_grouped(self.cfg, inputs):
      groups, args = inputs.shape[:2], rows_of_groups(*args)
    out = self.encoder(*args, deterministic=deterministic)
    z = self.head(out.pooled)
    return z if groups is None else z.reshape(*groups, -1)


class EncoderMultipleChoice(nn.Module):
  """Encoder + one score per (text, choice) row: texts [B, C, L] -> logits [B, C]."""
  cfg: EncoderConfig

  def setup(self):
    self.encoder = Encoder(self.cfg)
    self.head = SequenceClassificationHead(self.cfg, 1)

  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, *, deterministic: bool = True):
    rows = rows_of_groups(inputs, attention_mask, token_type_ids, segment_ids, positions)
    out = self.encoder(*rows, deterministic=deterministic)
    return self.head(out.pooled, deterministic=deterministic).reshape(inputs.shape[:2])


def is_grouped(cfg: EncoderConfig, inputs) -> bool:
  """Token ids [B, K, L]: K texts per example (choices, or a pair and its negative)."""
  return cfg.input_kind == "text" and inputs.ndim == 3


def rows_of_groups(*arrays_BxKxL) -> tuple:
  """[B, K, L] arrays as [B*K, L] rows (None stays None)."""
  return tuple(None if x is None else x.reshape(-1, x.shape[-1]) for x in arrays_BxKxL)
