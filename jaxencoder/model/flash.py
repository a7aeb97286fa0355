"""Flash attention kernels and the choice between them.

- `cudnn`: `jax.nn.dot_product_attention(implementation="cudnn")` on NVIDIA GPUs. Padding
  goes in as per-row key lengths (cuDNN's padding mask type: no [B, 1, L, L] mask is
  built), causal and causal sliding windows as cuDNN's own mask types. Packed rows
  (segment ids) have no such form in the public API: their [B, 1, L, L] mask is passed
  and cuDNN adds it as a bias.
- `splash`: the Pallas splash-attention kernel that ships with JAX
  (`jax.experimental.pallas.ops.tpu.splash_attention`) on TPUs. Padding and packed rows
  go in as segment ids; causal and sliding windows as its static masks, whose fully
  masked blocks it skips. Off TPU it runs in Pallas interpret mode (slow: for tests).

`IMPLEMENTATIONS` holds every implementation once: its kernel (one signature for all,
`kernel(q, k, v, attention.KernelCall) -> (out, weights or None)`) and what it can serve.
`plan_attention` picks the implementation for one call from the config, the target (the
platform of the mesh being compiled for, else the default backend) and what the call
needs; a kernel that cannot serve the call falls back to `xla` with one logged line that
says why and names the config key to change. `plan_layers` plans every layer of a stack
(a global layer, a local one and the sparse last block may each get their own) and logs
one line per reason, naming its layers; `recorded_plans` collects those per-layer plans
while a step is traced (the compile report reads them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
from typing import Callable, Iterator

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from jaxencoder.model.attention import KernelCall, fused_kernel, linear_kernel, xla_kernel
from jaxencoder.model.config import EncoderConfig, local_layer
from jaxencoder.model.layers import take_rows

log = logging.getLogger(__name__)

AUTO_KERNEL = {"gpu": "cudnn", "tpu": "splash"}  # backend -> what `auto` runs; else xla
SPLASH_BLOCK = 128  # splash's minimum block (one TPU lane width); lengths pad to it
_explained: set[str] = set()
_recorders: list[list[tuple["AttentionPlan", ...]]] = []  # open `recorded_plans` blocks
# An implementation's kernel: q [B, Q, H, K], k and v [B, L, H, K], what else it reads ->
# (out [B, Q, H, K], the attention weights [B, H, Q, L] or None).
Kernel = Callable[[jax.Array, jax.Array, jax.Array, KernelCall],
                  tuple[jax.Array, jax.Array | None]]


@dataclasses.dataclass(frozen=True)
class AttentionPlan:
  """What one attention call runs. `interpret`: splash in Pallas interpret mode.
  `fallback`: why the kernel `wanted` could not serve the call (then impl is xla)."""
  impl: str  # xla | fused | linear | cudnn | splash
  interpret: bool = False
  fallback: str | None = None
  wanted: str | None = None

  @property
  def needs_dense_mask(self) -> bool:
    return IMPLEMENTATIONS[self.impl].dense_mask

  @property
  def kernel(self) -> Kernel:
    """The implementation's kernel: (q, k, v, KernelCall) -> (out, weights or None)."""
    return IMPLEMENTATIONS[self.impl].kernel


@dataclasses.dataclass(frozen=True)
class Implementation:
  """One attention implementation: its kernel and what it can serve (a call needing more
  runs xla)."""
  name: str
  kernel: Kernel
  dense_mask: bool  # reads a [B, 1, Q, L] mask (else lengths or segment ids)
  weights: bool = False  # returns the attention weights (output_attentions)
  dropout: bool = False  # attention dropout
  bias: bool = True  # an additive position bias (T5 relative)
  per_layer_window: bool = False  # a traced window per layer (scan over mixed layers)
  cross: bool = False  # cross-attention
  decode: bool = False  # attention over a key/value cache
  sparse_causal: bool = False  # a causal / window mask on gathered query rows
  backends: tuple[str, ...] = ()  # where it runs natively; () = anywhere
  # Its own limits: (cfg, backend, window of this layer or None) -> the obstacle or None.
  check: Callable[[EncoderConfig, str, int | None], str | None] | None = None
  same_math: bool = True  # computes softmax attention (so xla can stand in for it)


def _cudnn_obstacle(cfg: EncoderConfig, backend: str, window: int | None) -> str | None:
  if cfg.dtype == "float32":
    return ("compute dtype is float32 (cuDNN flash attention needs bfloat16 or float16: "
            "set model.dtype='bfloat16')")
  head_dim, limit = cfg.resolved_head_dim, max_cudnn_head_dim()
  if head_dim % 8 or head_dim > limit:
    return f"head_dim={head_dim} (cuDNN needs a multiple of 8, at most {limit}: model.head_dim)"
  if window is not None and not cfg.causal:
    return "a two-sided sliding window (cuDNN windows are causal only: model.sliding_window)"
  return None


def cudnn_kernel(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, call: KernelCall):
  """`cudnn` (below): padding as key lengths; packed rows as their [B, 1, Q, L] mask."""
  packed = call.segment_ids_BxL is not None
  return cudnn_attention(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, call.key_mask_BxL,
                         causal=call.causal, sliding_window=call.window,
                         bias_BxHxQxL=call.bias_BxHxQxL,
                         mask_Bx1xQxL=call.mask_Bx1xQxL if packed else None), None


def splash_kernel(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, call: KernelCall):
  """`splash` (below): padding and packed rows as segment ids, the queries' gathered from
  their rows."""
  kv_segments_BxL = padded_segment_ids(call.key_mask_BxL, call.segment_ids_BxL)
  q_segments_BxQ = kv_segments_BxL
  if call.query_rows_BxQ is not None:
    q_segments_BxQ = take_rows(kv_segments_BxL, call.query_rows_BxQ)
  return splash_attention(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, q_segments_BxQ, kv_segments_BxL,
                          causal=call.causal, sliding_window=call.window,
                          interpret=call.interpret), None


# Every attention_impl but `auto`, once (tests/test_flash.py holds it to ATTENTION_IMPLS).
# The kernels of xla, fused and linear are in attention.py.
IMPLEMENTATIONS = {impl.name: impl for impl in (
    Implementation("xla", xla_kernel, dense_mask=True, weights=True, dropout=True,
                   per_layer_window=True, cross=True, decode=True, sparse_causal=True),
    Implementation("fused", fused_kernel, dense_mask=True, per_layer_window=True, cross=True,
                   sparse_causal=True),
    Implementation("linear", linear_kernel, dense_mask=False, bias=False, sparse_causal=True,
                   same_math=False),
    Implementation("cudnn", cudnn_kernel, dense_mask=False, backends=("gpu",),
                   check=_cudnn_obstacle),
    Implementation("splash", splash_kernel, dense_mask=False, bias=False, backends=("tpu",)),
)}
# What a call needs -> the reason a kernel that lacks it cannot serve the call.
# Each reason names what to change where a config key decides it.
_NEEDS = (("weights", "attention weights were requested (output_attentions=True)"),
          ("dropout", "attention dropout is on (the kernel has none: set "
                      "model.attention_dropout_rate=0)"),
          ("bias", "relative position bias (the kernel takes no bias: "
                   "model.position_embedding='relative')"),
          ("per_layer_window", "a per-layer window traced under nn.scan (the kernel's windows "
                               "are static)"),
          ("cross", "cross-attention"),
          ("decode", "attention over a key/value cache"),
          ("sparse_causal", "a causal or windowed mask on a sparse set of query rows (the "
                            "sparse MLM last block: max_predictions=0 computes every row)"))


def _explain_once(message: str) -> None:
  if message not in _explained:
    _explained.add(message)
    log.warning("%s", message)


def _target_device():
  mesh = jax.sharding.get_abstract_mesh()
  return None if mesh.empty else getattr(mesh, "abstract_device", None)


def target_backend() -> str:
  """The platform the program is compiled for: that of the active mesh's devices (so a CPU
  host compiling for a TPU topology plans for the TPU), else JAX's default backend."""
  platform = getattr(_target_device(), "platform", None) or jax.default_backend()
  return "gpu" if platform in ("cuda", "rocm") else platform


def max_cudnn_head_dim() -> int:
  """cuDNN's flash limit: 256 from Hopper (compute capability 9.0) on, else 128 (a
  compile-only target names its GPU but not its capability)."""
  device = _target_device() or jax.devices()[0]
  kind = getattr(device, "device_kind", "")
  capability = getattr(device, "compute_capability", None) or (
      "9.0" if any(name in kind for name in ("H100", "H200", "GH200", "B200")) else "0")
  return 256 if float(capability) >= 9.0 else 128


@dataclasses.dataclass(frozen=True)
class CallFacts:
  """What one attention call needs of its kernel: plan_attention's keywords."""
  output_attentions: bool = False
  dropout_active: bool = False
  has_bias: bool = False
  sparse_queries: bool = False
  per_layer_window: bool = False
  cross: bool = False
  decode: bool = False
  local: bool | None = None


def plan_attention(cfg: EncoderConfig, *, output_attentions: bool = False,
                   dropout_active: bool = False, has_bias: bool = False,
                   sparse_queries: bool = False, per_layer_window: bool = False,
                   cross: bool = False, decode: bool = False, local: bool | None = None,
                   backend: str | None = None) -> AttentionPlan:
  """The implementation for one call, decided here once from every fact about it; a
  requested kernel that cannot serve the call runs xla (`fallback` says why; logged once).

  `sparse_queries`: queries are a gathered subset of rows (the sparse last block), so
  query i is not key i and a causal / window mask cannot be a kernel's static one.
  `local`: None (no per-layer pattern: `cfg.sliding_window` holds everywhere), True (a
  local layer: the window) or False (a global layer: no window).
  `per_layer_window`: whether the layer is local is traced (a scan over mixed layers).
  """
  backend = backend or target_backend()
  plan = _choose(cfg, backend, CallFacts(output_attentions, dropout_active, has_bias,
                                         sparse_queries, per_layer_window, cross, decode, local))
  if plan.fallback:
    _explain_once(f"attention_impl={cfg.attention_impl!r}: {plan.wanted} cannot run this call "
                  f"({plan.fallback}); using xla")
  if plan.interpret:
    _explain_once(_interpret_line(cfg, plan, backend))
  return plan


def _choose(cfg: EncoderConfig, backend: str, facts: CallFacts) -> AttentionPlan:
  """plan_attention's decision, unlogged (plan_layers logs one line per reason)."""
  name = cfg.attention_impl
  if name == "auto":
    name = AUTO_KERNEL.get(backend, "xla")
  impl = IMPLEMENTATIONS[name]
  window = None if facts.local is False else cfg.sliding_window
  needs = {"weights": facts.output_attentions, "dropout": facts.dropout_active,
           "bias": facts.has_bias, "per_layer_window": facts.per_layer_window,
           "cross": facts.cross, "decode": facts.decode,
           "sparse_causal": facts.sparse_queries and (cfg.causal or window is not None)}
  obstacle = next((why for need, why in _NEEDS if needs[need] and not getattr(impl, need)), None)
  if obstacle is None and impl.backends == ("gpu",) and backend != "gpu":
    obstacle = f"there is no GPU (backend {backend!r})"
  if obstacle is None and impl.check is not None:
    obstacle = impl.check(cfg, backend, window)
  if obstacle and not impl.same_math:  # another model, not a faster softmax: no stand-in
    raise ValueError(f"attention_impl={name!r} cannot serve this call: {obstacle}")
  if obstacle:
    return AttentionPlan("xla", fallback=obstacle, wanted=name)
  if impl.backends and backend not in impl.backends:  # splash: interpreted elsewhere
    return AttentionPlan(name, interpret=True)
  return AttentionPlan(name)


def _interpret_line(cfg: EncoderConfig, plan: AttentionPlan, backend: str) -> str:
  return (f"attention_impl={cfg.attention_impl!r}: {plan.impl} on {backend} runs in "
          "Pallas interpret mode (slow; meant for tests)")


def plan_layers(cfg: EncoderConfig, *, sparse_last: bool = False, backend: str | None = None,
                **facts) -> tuple[AttentionPlan, ...]:
  """One plan per layer of an encoder stack: a global layer, a local one (its window) and
  the sparse last block (`sparse_last`: gathered query rows) are each planned for what they
  need, so a layer the kernel cannot serve falls back alone. One logged line per reason
  names its layers. `facts`: plan_attention's other keywords (CallFacts)."""
  backend = backend or target_backend()
  plans = tuple(_choose(cfg, backend, CallFacts(
      local=local_layer(cfg, i), sparse_queries=sparse_last and i == cfg.num_layers - 1,
      **facts)) for i in range(cfg.num_layers))
  for message in fallback_lines(cfg, plans):
    _explain_once(message)
  if interpreted := next((p for p in plans if p.interpret), None):
    _explain_once(_interpret_line(cfg, interpreted, backend))
  for recorder in _recorders:
    recorder.append(plans)
  return plans


def layer_ranges(layers: list[int]) -> str:
  """'0-20, 21' style: consecutive runs of layer indices."""
  runs, start = [], None
  for i, n in enumerate(layers):
    start = n if start is None else start
    if i + 1 == len(layers) or layers[i + 1] != n + 1:
      runs.append(str(start) if start == n else f"{start}-{n}")
      start = None
  return ", ".join(runs)


def fallbacks(plans: tuple[AttentionPlan, ...]) -> dict[tuple[str, str], list[int]]:
  """{(kernel, why it could not serve them): the layers concerned}, in layer order."""
  out: dict[tuple[str, str], list[int]] = {}
  for i, plan in enumerate(plans):
    if plan.fallback:
      out.setdefault((plan.wanted, plan.fallback), []).append(i)
  return out


def fallback_lines(cfg: EncoderConfig, plans: tuple[AttentionPlan, ...]) -> list[str]:
  """One line per reason some layers run xla instead of the requested kernel."""
  return [f"attention_impl={cfg.attention_impl!r}: {kernel} cannot run layers "
          f"{layer_ranges(layers)} of {len(plans)} ({why}); using xla"
          for (kernel, why), layers in fallbacks(plans).items()]


@contextlib.contextmanager
def recorded_plans() -> Iterator[list[tuple[AttentionPlan, ...]]]:
  """Collects the per-layer plans (`plan_layers`) of every stack traced inside the block."""
  plans: list[tuple[AttentionPlan, ...]] = []
  _recorders.append(plans)
  try:
    yield plans
  finally:
    _recorders.remove(plans)


# ---------------------------------------------------------------- cuDNN
def check_right_padded(key_mask_BxL) -> None:
  """Raises if a concrete mask has a pad before a real token (lengths could not say it);
  under jit the mask is abstract and right padding is assumed, as the pipelines make."""
  if isinstance(key_mask_BxL, jax.core.Tracer):
    return
  mask = np.asarray(key_mask_BxL).astype(bool)
  prefix = np.arange(mask.shape[1])[None, :] < mask.sum(axis=1, keepdims=True)
  if not np.array_equal(mask, prefix):
    rows = np.flatnonzero((mask != prefix).any(axis=1)).tolist()
    raise ValueError(f"attention_impl 'cudnn' takes padding as lengths: padding must come "
                     f"after the real tokens, but rows {rows[:5]} have a pad before a real "
                     "token; right-pad them or use attention_impl='xla'")


def cudnn_attention(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, key_mask_BxL, *, causal: bool,
                    sliding_window: int | None, bias_BxHxQxL=None, mask_Bx1xQxL=None,
                    implementation: str = "cudnn"):
  """Attention through cuDNN. Padding must be on the right (real tokens first): it goes in
  as key lengths. `mask_Bx1xQxL` (packed rows only) replaces the lengths.
  `implementation="xla"` runs the same call on any backend (tests)."""
  lengths = None
  if mask_Bx1xQxL is None:
    check_right_padded(key_mask_BxL)
    lengths = key_mask_BxL.sum(axis=-1, dtype=jnp.int32)
  return jax.nn.dot_product_attention(
      q_BxQxHxK, k_BxLxHxK, v_BxLxHxK,
      bias=None if bias_BxHxQxL is None else bias_BxHxQxL.astype(q_BxQxHxK.dtype),
      mask=mask_Bx1xQxL, is_causal=causal, key_value_seq_lengths=lengths,
      local_window_size=None if sliding_window is None else (sliding_window, 0),
      implementation=implementation)


# ---------------------------------------------------------------- splash
def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _block(length: int) -> int:
  return next(b for b in (512, 256, 128) if length % b == 0)


def _splash_mha(q_len: int, kv_len: int, num_heads: int, causal: bool,
                sliding_window: int | None, interpret: bool):
  """A splash kernel for padded lengths (multiples of 128). Built at each trace (its mask
  tables are numpy work at trace time; cached kernels would carry one trace's arrays
  into another)."""
  # lazy: optional extra tpu (the splash kernel runs on TPU; CPU tests interpret it)
  from jax.experimental.pallas.ops.tpu.splash_attention import (
      splash_attention_kernel as splash, splash_attention_mask as masks)
  shape = (q_len, kv_len)
  if sliding_window is not None:
    one_head = masks.LocalMask(shape, (sliding_window, 0 if causal else sliding_window), 0)
  elif causal:
    one_head = masks.CausalMask(shape)
  else:
    one_head = masks.FullMask(shape)
  bq, bkv = _block(q_len), _block(kv_len)
  blocks = splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv,
                             block_q_dkv=bq, block_kv_dkv=bkv, block_kv_dkv_compute=bkv,
                             block_q_dq=bq, block_kv_dq=bkv)
  return splash.make_splash_mha(masks.MultiHeadMask([one_head] * num_heads),
                                head_shards=1, q_seq_shards=1, block_sizes=blocks,
                                interpret=interpret)


def padded_segment_ids(key_mask_BxL, segment_ids_BxL=None):
  """Segment ids where padding is 0: a token sees only keys of its own non-zero id."""
  ids_BxL = jnp.ones_like(key_mask_BxL, jnp.int32) if segment_ids_BxL is None else segment_ids_BxL
  return jnp.where(key_mask_BxL.astype(bool), ids_BxL.astype(jnp.int32), 0)


def _pad_rows(x, length: int, axis: int = 1):
  pad = [(0, 0)] * x.ndim
  pad[axis] = (0, length - x.shape[axis])
  return jnp.pad(x, pad)


def _splash_local(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, q_segments_BxQ, kv_segments_BxL, *,
                  causal, sliding_window, interpret):
  # lazy: optional extra tpu (the splash kernel runs on TPU; CPU tests interpret it)
  from jax.experimental.pallas.ops.tpu.splash_attention.splash_attention_kernel import (
      SegmentIds)
  q_len, kv_len = q_BxQxHxK.shape[1], k_BxLxHxK.shape[1]
  q_pad, kv_pad = _round_up(q_len, SPLASH_BLOCK), _round_up(kv_len, SPLASH_BLOCK)
  # Padded rows get segment 0: they see only padding keys and are sliced off below.
  heads_first = lambda x, n: jnp.swapaxes(_pad_rows(x, n), 1, 2)  # [B, H, n, K]
  q = heads_first(q_BxQxHxK * q_BxQxHxK.shape[-1] ** -0.5, q_pad)
  k, v = heads_first(k_BxLxHxK, kv_pad), heads_first(v_BxLxHxK, kv_pad)
  segments = SegmentIds(_pad_rows(q_segments_BxQ, q_pad), _pad_rows(kv_segments_BxL, kv_pad))
  kernel = _splash_mha(q_pad, kv_pad, q.shape[1], causal, sliding_window, interpret)
  out_BxHxQxK = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=s))(q, k, v, segments)
  return jnp.swapaxes(out_BxHxQxK, 1, 2)[:, :q_len]


def _mesh_spec(mesh, batch: int, heads: int) -> P:
  """[B, L, H, K] spec from the logical rules: batch and heads split where they divide."""
  batch_axes, _, head_axes, _ = nn.logical_to_mesh_axes(("act_batch", None, "heads", None))
  size = lambda axes: math.prod(mesh.shape[a] for a in (
      () if axes is None else (axes,) if isinstance(axes, str) else axes))
  batch_axes = batch_axes if batch % size(batch_axes) == 0 else None
  head_axes = head_axes if heads % size(head_axes) == 0 else None
  return P(batch_axes, None, head_axes, None)


def splash_attention(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, q_segments_BxQ, kv_segments_BxL, *,
                     causal: bool, sliding_window: int | None, interpret: bool = False):
  """Splash attention on [B, L, H, K] inputs with segment ids (0 = padding).

  The kernel is not partitioned by XLA: under a mesh it runs in shard_map, each device on
  its batch rows and heads (per the `act_batch` and `heads` rules)."""
  local = functools.partial(_splash_local, causal=causal, sliding_window=sliding_window,
                            interpret=interpret)
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return local(q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, q_segments_BxQ, kv_segments_BxL)
  spec = _mesh_spec(mesh, q_BxQxHxK.shape[0], q_BxQxHxK.shape[2])
  rows = P(spec[0], None)
  return jax.shard_map(local, mesh=mesh, in_specs=(spec, spec, spec, rows, rows),
                       out_specs=spec, check_vma=False)(
                           q_BxQxHxK, k_BxLxHxK, v_BxLxHxK, q_segments_BxQ, kv_segments_BxL)
