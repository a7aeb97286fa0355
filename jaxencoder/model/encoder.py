"""The encoder: embeddings, a stack of Transformer blocks, pooling."""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxencoder.model.attention import AttentionInputs, MultiHeadAttention
from jaxencoder.model.config import EncoderConfig, local_layer
from jaxencoder.model.embeddings import Embeddings
from jaxencoder.model.flash import AttentionPlan, plan_layers
from jaxencoder.model.ffn import FeedForward
from jaxencoder.model.inputs import check_inputs, check_output_positions
from jaxencoder.model.interventions import Interventions
from jaxencoder.model.layers import constrain, norm, take_rows
from jaxencoder.model.masks import make_attention_mask
from jaxencoder.model.pooling import Pooler
from jaxencoder.model.positions import RelativePositionBias

# Param-tree names: the one place they are spelled. Optimizer rules (layer-wise LR decay,
# freezing), the loop <-> scan layout converter, heads and the Hugging Face name maps
# import them, so a rename here moves everything at once.
ENCODER = "encoder"  # where task models and EncoderForMaskedLM hold the Encoder
EMBEDDINGS = "embeddings"  # the front end: token / patch / series, positions, types
LAYER_PREFIX = "layers_"  # looped stack: layers_0 ... layers_{N-1}
SCANNED_LAYERS = "layers"  # scanned stack: one subtree, every leaf with a leading [N] axis
# How a scanned stack runs (a view of the stored [N] stack, never stored): nn.scan over
# GROUPS of one period of the layer pattern, slot j of group g being layer g * period + j.
GROUPS = "groups"
SLOT_PREFIX = "slot_"
_LAYER_NAME = re.compile(rf"^{LAYER_PREFIX}(\d+)$")


def layer_name(i: int) -> str:
  """Name of layer i in the looped stack."""
  return f"{LAYER_PREFIX}{i}"


def path_parts(path) -> tuple[str, ...]:
  """('encoder', 'layers_3', ...) from 'encoder/layers_3/...', a tuple of names or a jax
  key path (DictKey / GetAttrKey entries)."""
  if isinstance(path, str):
    return tuple(path.split("/"))
  return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def layer_index(path) -> int | None:
  """Index i of the looped layer `layers_i` that `path` lies in; None outside the stack
  (and for the scanned stack, whose leaves hold every layer: see `in_scanned_stack`)."""
  return next((int(m.group(1)) for p in path_parts(path) if (m := _LAYER_NAME.match(p))), None)


def in_scanned_stack(path) -> bool:
  """Whether `path` lies in the scanned stack (leading axis = layer index)."""
  return SCANNED_LAYERS in path_parts(path)


def in_embeddings(path) -> bool:
  return EMBEDDINGS in path_parts(path)


REMAT_POLICIES = {
    "full": None,  # save nothing, recompute the whole block
    "save_dots": jax.checkpoint_policies.checkpoint_dots,
    "save_dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


@flax.struct.dataclass
class EncoderOutput:
  """What the encoder returns; a pytree, so it passes through jit."""
  last_hidden_state: jax.Array  # [B, L, D]
  pooled: jax.Array  # [B, D]
  hidden_states: tuple[jax.Array, ...] | None = None  # N + 1 of [B, L, D]
  attentions: tuple[jax.Array, ...] | None = None  # N of [B, H, L, L]
  # N of [B, L, H, K]: each head's output before the output projection
  head_outputs: tuple[jax.Array, ...] | None = None


@flax.struct.dataclass
class BlockInputs:
  """What every block of one call shares: a pytree whose flags are static (they live in
  its tree structure), so nn.remat needs no static_argnums and nn.scan broadcasts it whole."""
  mask_Bx1xLxL: jax.Array | None
  bias_BxHxLxL: jax.Array | None
  key_mask_BxL: jax.Array
  positions_BxL: jax.Array
  segment_ids_BxL: jax.Array | None  # packed rows (0 = padding); None when not packed
  deterministic: bool = flax.struct.field(pytree_node=False)
  output_attentions: bool = flax.struct.field(pytree_node=False)
  output_hidden_states: bool = flax.struct.field(pytree_node=False)
  # One per layer (flash.plan_layers); () runs xla everywhere.
  plans: tuple[AttentionPlan, ...] = flax.struct.field(pytree_node=False, default=())
  # cfg.global_attention_every > 0: the local layers' mask (mask_Bx1xLxL is the global one).
  local_mask_Bx1xLxL: jax.Array | None = None
  # 1 keeps head h of layer n, 0 zeroes its output before the output projection; None: all.
  head_mask_NxH: jax.Array | None = None
  interventions: Interventions | None = None  # None: no edits, nothing traced
  output_head_outputs: bool = flax.struct.field(pytree_node=False, default=False)

  def plan(self, layer: int | None) -> AttentionPlan:
    """Layer `layer`'s plan; None (a plain scan, whose layers all share one plan): layer 0's."""
    return self.plans[layer or 0] if self.plans else AttentionPlan("xla")

  def layer_head_mask(self, index):
    """Layer `index`'s row of the head mask [H] (index an int or traced); None without."""
    return None if self.head_mask_NxH is None else self.head_mask_NxH[index]

  def layer_edit(self, index):
    """Layer `index`'s interventions.LayerEdit (index an int or traced); None without."""
    return None if self.interventions is None else self.interventions.at_layer(index)

  def layer_mask(self, local):
    """The mask of a layer: `local` None (no per-layer pattern), a bool, or traced."""
    if local is None or self.mask_Bx1xLxL is None:
      return self.mask_Bx1xLxL
    if isinstance(local, jax.Array):
      return jnp.where(local, self.local_mask_Bx1xLxL, self.mask_Bx1xLxL)
    return self.local_mask_Bx1xLxL if local else self.mask_Bx1xLxL


def check_head_mask(cfg: EncoderConfig, head_mask) -> jax.Array:
  """`head_mask` as a float [num_layers, num_heads] array; a ValueError naming the shape
  it should have otherwise."""
  expected = (cfg.num_layers, cfg.num_heads)
  if tuple(jnp.shape(head_mask)) != expected:
    raise ValueError(f"head_mask has shape {tuple(jnp.shape(head_mask))}, expected "
                     f"[num_layers, num_heads] = {list(expected)}")
  return jnp.asarray(head_mask, jnp.float32)


class EncoderBlock(nn.Module):
  """Self-attention + feed-forward, post-norm (BERT) or pre-norm.

  Returns (x, out): out holds this layer's output and attention weights when asked
  (None otherwise), so a scanned stack stacks them along a leading layer axis.
  With `query_rows_BxQ`, only those rows are computed (keys and values still come
  from every position) and x is [B, Q, D]. Its index (layer 0's norm, the head mask) is
  `layer` in a looped stack, `scanned_layer` (traced) in a scanned one. Whether it attends
  globally or locally, and its attention plan, are static: from `layer`, else from `slot`
  (its place in one period of the layer pattern, under a scan by period), else traced.
  Its row of `inputs.interventions` edits its heads' outputs and then its output x (a
  pre-norm Encoder edits its last layer's x after the final norm instead).
  """
  cfg: EncoderConfig
  layer: int | None = None
  slot: int | None = None

  @nn.compact
  def __call__(self, x_BxLxD, inputs: BlockInputs, query_rows_BxQ=None, scanned_layer=None):
    cfg = self.cfg
    drop = lambda y: nn.Dropout(cfg.dropout_rate)(y, deterministic=inputs.deterministic)
    pre = cfg.norm_position == "pre"
    index = self.layer if self.layer is not None else scanned_layer
    if index is None and (cfg.global_attention_every or not cfg.first_attention_norm):
      raise ValueError("this config differs per layer: give EncoderBlock its `layer` index")
    static = self.layer if self.layer is not None else self.slot
    local = local_layer(cfg, index if static is None else static)
    attention = MultiHeadAttention(cfg, name="attention")
    h_BxLxD = self._attention_input(x_BxLxD, index) if pre else x_BxLxD
    edit = inputs.layer_edit(index)
    attention_inputs = AttentionInputs(
        inputs.layer_mask(local), inputs.bias_BxHxLxL, inputs.key_mask_BxL, inputs.positions_BxL,
        inputs.segment_ids_BxL, inputs.plan(static), local, inputs.layer_head_mask(index), edit)
    h_BxLxD, probs_BxHxLxL, heads_BxLxHxK = attention(h_BxLxD, attention_inputs, query_rows_BxQ,
                                                      deterministic=inputs.deterministic)
    if query_rows_BxQ is not None:  # from here on only the Q query rows: [B, Q, D]
      x_BxLxD = take_rows(x_BxLxD, query_rows_BxQ)
    x_BxLxD = x_BxLxD + drop(h_BxLxD)
    if not pre:
      x_BxLxD = norm(cfg, name="attention_norm")(x_BxLxD)
    h_BxLxD = norm(cfg, name="ffn_norm")(x_BxLxD) if pre else x_BxLxD
    h_BxLxD = FeedForward(cfg, name="ffn")(h_BxLxD, deterministic=inputs.deterministic)
    x_BxLxD = x_BxLxD + drop(h_BxLxD)
    if not pre:
      x_BxLxD = norm(cfg, name="ffn_norm")(x_BxLxD)
    if edit is not None:
      x_BxLxD = edit.stream(x_BxLxD)
    x_BxLxD = constrain(x_BxLxD)
    out = {"hidden_state": x_BxLxD if inputs.output_hidden_states else None,
           "attention": probs_BxHxLxL if inputs.output_attentions else None,
           "head_outputs": heads_BxLxHxK if inputs.output_head_outputs else None}
    return x_BxLxD, out

  def _attention_input(self, x_BxLxD, index):
    """Pre-norm attention input: attention_norm(x), or x itself in layer 0 when
    cfg.first_attention_norm is False (the param exists either way: one stacked layout)."""
    normed_BxLxD = norm(self.cfg, name="attention_norm")(x_BxLxD)
    if self.cfg.first_attention_norm:
      return normed_BxLxD
    if isinstance(index, jax.Array):
      return jnp.where(index == 0, x_BxLxD, normed_BxLxD)
    return x_BxLxD if index == 0 else normed_BxLxD


def block_class(cfg: EncoderConfig, in_scan: bool,
                block: type[nn.Module] = EncoderBlock) -> type[nn.Module]:
  """`block`, rematerialised per `cfg.remat_policy` (its flags ride in its inputs pytree,
  BlockInputs for EncoderBlock)."""
  if cfg.remat_policy == "none":
    return block
  # Inside nn.scan the loop boundary already keeps XLA from merging recompute and forward.
  return nn.remat(block, policy=REMAT_POLICIES[cfg.remat_policy], prevent_cse=not in_scan)


_LAYERS_AXIS = {nn.PARTITION_NAME: "layers"}  # logical name of the scanned params' [N] axis


def scanned_blocks(cfg: EncoderConfig, length: int,
                   block: type[nn.Module] | None = None) -> type[nn.Module]:
  """`length` blocks under nn.scan (default: EncoderBlocks, rematerialised per the config):
  params (and a decoder's 'cache') stacked on a leading [length] axis, the block inputs
  broadcast to every step, dropout drawn afresh per layer. EncoderBlocks are called
  (x, inputs, None, layers_N): their indices are scanned, the rest broadcast."""
  in_axes = nn.broadcast if block else (nn.broadcast, nn.broadcast, 0)
  return nn.scan(block or block_class(cfg, in_scan=True),
                 variable_axes={"params": 0, "cache": 0},
                 split_rngs={"params": True, "dropout": True}, in_axes=in_axes,
                 length=length, metadata_params=_LAYERS_AXIS)


def period_layout(cfg: EncoderConfig, sparse_last: bool) -> tuple[int, int, tuple[int, ...]]:
  """(period P, groups G, unrolled layers) of a scanned stack run by period: nn.scan over G
  groups of P layers (P = global_attention_every, else 1), so that each layer's window,
  RoPE base and attention kernel are static; then the layers left over (N mod P, and
  the sparse last block) one by one. ModernBERT-base: 22 layers = 7 groups of 3, layer 21."""
  period = cfg.global_attention_every or 1
  groups = (cfg.num_layers - sparse_last) // period
  return period, groups, tuple(range(groups * period, cfg.num_layers))


def slot_name(j: int) -> str:
  return f"{SLOT_PREFIX}{j}"


def _period_view(variables, *, period: int, groups: int, unrolled: tuple[int, ...]):
  """View of the stored [N] stack as {'groups': {'slot_j': [G, ...]}, 'layers_i': [...]}:
  slices, so gradients flow back to all N layers. Boxed params lose their 'layers' name
  in the unrolled layers."""
  stack = variables["params"]
  view = {layer_name(i): nn.meta.remove_axis(jax.tree.map(lambda x, i=i: x[i], stack), 0,
                                             _LAYERS_AXIS) for i in unrolled}
  if groups:
    view[GROUPS] = {slot_name(j): jax.tree.map(lambda x, j=j: x[j:groups * period:period], stack)
                    for j in range(period)}
  return {"params": view}


class _Period(nn.Module):
  """One period of the layer pattern: P blocks, slot j static (window, RoPE base, plan),
  its layer index group * P + j traced. The body of the scan by period."""
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, x_BxLxD, inputs: BlockInputs, group):
    period, outs = self.cfg.global_attention_every or 1, []
    for j in range(period):
      block = block_class(self.cfg, in_scan=True)(self.cfg, slot=j, name=slot_name(j))
      x_BxLxD, out = block(x_BxLxD, inputs, None, group * period + j)
      outs.append(out)
    return x_BxLxD, outs


class _PeriodicStack(nn.Module):
  """The scanned stack run by period (`period_layout`), the last block on `rows_BxQ` only
  when `sparse_last`. Used under nn.map_variables(_period_view), never at init (which
  creates the stored [N] layout with one plain scan)."""
  cfg: EncoderConfig
  sparse_last: bool

  @nn.compact
  def __call__(self, x_BxLxD, inputs: BlockInputs, rows_BxQ):
    cfg, outs = self.cfg, []
    period, groups, unrolled = period_layout(cfg, self.sparse_last)
    if groups:
      scan = nn.scan(_Period, variable_axes={"params": 0},
                     split_rngs={"params": True, "dropout": True},
                     in_axes=(nn.broadcast, 0), length=groups, metadata_params=_LAYERS_AXIS)
      x_BxLxD, stacked = scan(cfg, name=GROUPS)(x_BxLxD, inputs, jnp.arange(groups))
      outs = [{k: None if v is None else v[g] for k, v in stacked[j].items()}
              for g in range(groups) for j in range(period)]
    for i in unrolled:
      rows = rows_BxQ if self.sparse_last and i == cfg.num_layers - 1 else None
      x_BxLxD, out = block_class(cfg, in_scan=False)(cfg, i, name=layer_name(i))(
          x_BxLxD, inputs, rows)
      outs.append(out)
    return x_BxLxD, outs


@dataclasses.dataclass(frozen=True)
class ProbeOptions:
  """The Encoder call's keyword options for studies of the model: what else to return
  and what to change on the way (see Encoder)."""
  output_hidden_states: bool = False
  output_attentions: bool = False
  output_head_outputs: bool = False
  head_mask: Any = None  # [N, H]
  interventions: Interventions | None = None

  @classmethod
  def of(cls, options: dict[str, Any]) -> ProbeOptions:
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
      raise TypeError(f"Encoder got unexpected keyword arguments {unknown}; its options are "
                      f"{[f.name for f in dataclasses.fields(cls)]}")
    return cls(**options)

  @property
  def every_row(self) -> bool:
    """Whether the last block must compute every row (no sparse last block)."""
    return (self.output_hidden_states or self.output_attentions or self.output_head_outputs
            or self.interventions is not None)


class Encoder(nn.Module):
  """Transformer encoder over token ids, images or continuous series.

  Call: `model.apply(variables, inputs, attention_mask=None, token_type_ids=None,
  segment_ids=None, positions=None, deterministic=True, output_positions=None,
  output_hidden_states=False, output_attentions=False, output_head_outputs=False,
  head_mask=None, interventions=None)` -> EncoderOutput (the options after
  output_positions: ProbeOptions). `inputs` is int ids [B, L] (text),
  float images [B, H, W, C] or float series [B, L, F], per `cfg.input_kind`.
  `segment_ids` [B, L] mark packed sequences (0 = padding); tokens attend only
  within their segment. `output_positions` [B, M] (e.g. MLM's masked positions)
  makes `last_hidden_state` [B, M, D], the final states at those positions only;
  with cls pooling (BERT), the last block then computes its queries, feed-forward
  and norms only for those rows and [CLS] (keys and values still see every
  position): same values, about (1 - M/L) of a layer's work saved.
  `head_mask` [num_layers, num_heads] (1 keeps, 0 zeroes a head's output before the
  output projection; fractions scale it) serves head-importance studies, with every
  attention implementation. `output_head_outputs` returns those per-head outputs
  ([B, L, H, K] per layer). `interventions` (an interventions.Interventions) patches,
  erases or ablates layer n's output, hidden_states[n + 1] (a pre-norm model's last layer
  after its final norm), or a head's output, in every layout and attention implementation;
  absent, nothing is traced for it.
  """
  cfg: EncoderConfig

  @nn.compact
  def __call__(self, inputs, attention_mask=None, token_type_ids=None, segment_ids=None,
               positions=None, *, deterministic: bool = True, output_positions=None,
               **options):
    cfg, options = self.cfg, ProbeOptions.of(options)
    len_BxL = check_inputs(cfg, inputs, attention_mask, token_type_ids, segment_ids, positions)
    if cfg.attention_impl == "linear" and segment_ids is not None:
      raise ValueError("attention_impl='linear' does not support segment_ids (packed rows)")
    if attention_mask is None:
      attention_mask = (segment_ids != 0 if segment_ids is not None
                        else jnp.ones(len_BxL, jnp.int32))
    x_BxLxD, mask_BxL, segment_ids, positions_BxL = Embeddings(cfg, name=EMBEDDINGS)(
        inputs, attention_mask, token_type_ids, segment_ids, positions,
        deterministic=deterministic)
    x_BxLxD = constrain(x_BxLxD)
    if output_positions is not None:
      check_output_positions(output_positions, *x_BxLxD.shape[:2])
    # Init runs the full stack, which creates the scanned params in their stored layout.
    sparse_last = (output_positions is not None and cfg.pooling == "cls"
                   and not options.every_row and not self.is_initializing())
    rows_BxQ = None  # rows the last block computes: position 0 (cls pooling) + output_positions
    if sparse_last:
      rows_BxQ = jnp.concatenate([jnp.zeros_like(output_positions[:, :1]), output_positions], 1)
    block_inputs = self._block_inputs(x_BxLxD.shape[:2], mask_BxL, segment_ids, positions_BxL,
                                      deterministic, options, sparse_last)
    last_BxLxD, layer_outs = self._stack_and_final_norm(x_BxLxD, block_inputs, rows_BxQ)
    # Sparse: last_BxLxD holds the Q = 1 + M rows, [CLS] first (cls pooling reads row 0).
    pool_in = (last_BxLxD[:, :1], mask_BxL[:, :1]) if sparse_last else (last_BxLxD, mask_BxL)
    pooled_BxD = Pooler(cfg, name="pooler")(*pool_in)
    hidden = None
    if options.output_hidden_states:
      hidden = (x_BxLxD,) + tuple(o["hidden_state"] for o in layer_outs[:-1]) + (last_BxLxD,)
    per_layer = lambda key, wanted: tuple(o[key] for o in layer_outs) if wanted else None
    if output_positions is not None:
      last_BxLxD = last_BxLxD[:, 1:] if sparse_last else take_rows(last_BxLxD, output_positions)
    return EncoderOutput(last_BxLxD, pooled_BxD, hidden,
                         per_layer("attention", options.output_attentions),
                         per_layer("head_outputs", options.output_head_outputs))

  def _block_inputs(self, len_BxL, mask_BxL, segment_ids, positions_BxL, deterministic: bool,
                    options: ProbeOptions, sparse_last: bool) -> BlockInputs:
    """What every block of this call shares: attention plans, masks, bias, probe options."""
    cfg = self.cfg
    mixed = cfg.global_attention_every > 0  # global and local layers
    if self.is_initializing() and mixed and cfg.scan_layers:
      plans = ()  # one plain scan (its layer kinds traced) creates the params: xla
    else:
      plans = plan_layers(
          cfg, output_attentions=options.output_attentions, sparse_last=sparse_last,
          dropout_active=not deterministic and cfg.attention_dropout_rate > 0,
          has_bias=cfg.position_embedding == "relative")
    mask_Bx1xLxL = local_mask_Bx1xLxL = None  # flash kernels take padding as lengths or
    #                                           segment ids instead
    if not plans or any(p.needs_dense_mask or (p.impl == "cudnn" and segment_ids is not None)
                        for p in plans):
      mask_Bx1xLxL = make_attention_mask(mask_BxL, segment_ids, causal=cfg.causal,
                                         sliding_window=None if mixed else cfg.sliding_window)
      if mixed:
        local_mask_Bx1xLxL = make_attention_mask(mask_BxL, segment_ids,
                                                 sliding_window=cfg.sliding_window)
    bias_BxHxLxL = None
    if cfg.position_embedding == "relative":
      bias_BxHxLxL = RelativePositionBias(cfg, name="relative_bias")(positions_BxL)
    head_mask = options.head_mask
    if head_mask is not None:
      head_mask = check_head_mask(cfg, head_mask)
    interventions = options.interventions
    if interventions is not None:
      interventions = interventions.checked(cfg, *len_BxL)
    return BlockInputs(mask_Bx1xLxL, bias_BxHxLxL, mask_BxL, positions_BxL, segment_ids,
                       deterministic, options.output_attentions, options.output_hidden_states,
                       plans, local_mask_Bx1xLxL, head_mask, interventions,
                       options.output_head_outputs)

  def _stack_and_final_norm(self, x_BxLxD, inputs: BlockInputs, rows_BxQ):
    """The stack, then a pre-norm model's final norm. There the last layer's stream edits
    act after the norm, so layer n's edit is on hidden_states[n + 1] in every model."""
    cfg, edits = self.cfg, inputs.interventions
    if cfg.norm_position != "pre":
      return self._stack(x_BxLxD, inputs, rows_BxQ)
    last = cfg.num_layers - 1
    if edits is not None:
      inputs = inputs.replace(interventions=edits.without_stream(last))
    x_BxLxD, layer_outs = self._stack(x_BxLxD, inputs, rows_BxQ)
    x_BxLxD = norm(cfg, name="final_norm")(x_BxLxD)
    if edits is not None:
      x_BxLxD = edits.at_layer(last).stream(x_BxLxD)
    return x_BxLxD, layer_outs

  def _stack(self, x_BxLxD, inputs: BlockInputs,
             last_rows_BxQ=None) -> tuple[jax.Array, list[dict[str, Any]]]:
    """Runs the N blocks (loop or nn.scan); returns x and each layer's intermediates.

    `last_rows_BxQ`: the last block computes just those rows. A scanned stack of global
    and local layers, or with a sparse last block, runs by period (`period_layout`) on a
    view of the same stored [N] params; init and a uniform stack run one plain scan.
    """
    cfg = self.cfg
    if not cfg.scan_layers:
      block, outs = block_class(cfg, in_scan=False), []
      for i in range(cfg.num_layers):
        rows = last_rows_BxQ if i == cfg.num_layers - 1 else None
        x_BxLxD, out = block(cfg, i, name=layer_name(i))(x_BxLxD, inputs, rows)
        outs.append(out)
      return x_BxLxD, outs
    sparse_last = last_rows_BxQ is not None
    if sparse_last or (cfg.global_attention_every and not self.is_initializing()):
      period, groups, unrolled = period_layout(cfg, sparse_last)
      view = functools.partial(_period_view, period=period, groups=groups, unrolled=unrolled)
      stack = nn.map_variables(_PeriodicStack, "params", trans_in_fn=view)
      return stack(cfg, sparse_last, name=SCANNED_LAYERS)(x_BxLxD, inputs, last_rows_BxQ)
    x_BxLxD, stacked = scanned_blocks(cfg, cfg.num_layers)(cfg, name=SCANNED_LAYERS)(
        x_BxLxD, inputs, None, jnp.arange(cfg.num_layers))
    return x_BxLxD, [{k: None if v is None else v[i] for k, v in stacked.items()}
                     for i in range(cfg.num_layers)]
