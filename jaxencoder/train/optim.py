"""Optimizer and learning-rate schedule built from an `optim` ConfigDict.

Config keys (defaults in `default_optim_config()`; unknown keys raise):
  name              "adamw" | "adafactor" | "lion".
  learning_rate     peak LR. b1, b2, eps: Adam/Lion moments (eps unused by Lion;
                    adafactor keeps optax's defaults and ignores b1, b2, eps).
  weight_decay      decoupled, multiplied by the scheduled LR for all three optimizers.
  decay_embeddings  False: no weight decay on anything under `embeddings`.
                    Biases and norm scales (leaf named `bias`/`scale`, or <= 1-D once a
                    scanned layer axis is dropped) are never decayed.
  schedule          "linear" (to end_lr_factor * lr at total_steps) | "cosine" (same
                    end points) | "inverse_sqrt" (lr * sqrt(warmup / max(step, warmup)))
                    | "constant" | "wsd" (warmup-stable-decay: the peak LR until the last
                    decay_fraction of total_steps, then a decay_shape decay to the same end
                    point). All start with a linear warmup from 0 over warmup_steps;
                    total_steps must exceed warmup_steps for linear/cosine, and hold the
                    warmup and the decay for wsd. Steps count updates (0: the first).
  decay_fraction    wsd: the share of total_steps its final decay takes (default 0.1;
                    round(fraction * total_steps) steps, at least 1), in (0, 1].
  decay_shape       wsd: "1-sqrt" (default; factor 1 - sqrt(x) over the decay's progress x
                    in [0, 1], mapped to [end_lr_factor, 1]: Hägele et al. 2024) | "linear".
  grad_clip_norm    global-norm clipping of the trainable grads; 0 or None disables.
  grad_accum_steps  k: each step is one update over k micro-batches of batch_size rows
                    (train/steps.train_step sums their losses and weights, then
                    divides once: the update of one k x batch_size batch; contrastive
                    tasks: GradCache, negatives over all k micro-batches). Read by the
                    training side; the optimizer itself sees one gradient per step, so
                    warmup and the schedule count updates.
  layer_decay       None or d in (0, 1]: LR x d ** distance, distance 0 above the stack
                    (heads, pooler, final_norm, shared relative_bias), N - i for layer i,
                    N + 1 for `embeddings`. Looped (`layers_{i}`) and scanned (`layers`,
                    leading axis N: a per-layer [N, 1, ...] factor) layouts.
  lr_multipliers    [(regex, multiplier), ...] searched in the '/'-joined path; the first
                    match wins; multiplies the layer decay. (A scanned stack is one path.)
  freeze            [regex, ...]: matched params get zero updates and no optimizer state.
  freeze_encoder    True: everything under `encoder/` frozen (trainable head only).
  freeze_layers     k: embeddings and layers 0..k-1 frozen; in the scanned layout the
                    update of indices < k is zeroed (the leaf keeps its state).
  lora_also_train   [regex, ...]: params with LoRA adapters (`lora_a`, `lora_b`; the model's
                    lora_rank > 0) freeze every encoder param but the adapters and these
                    matches (e.g. "norm"); the rest of the model (heads) trains. The
                    encoder is the `encoder/` subtree, or the whole tree if it has none.

Params are unboxed (plain arrays or ShapeDtypeStructs, e.g. `nn.meta.unbox(...)`).
Per trainable leaf the chain is: [zero frozen layer slices] -> clip -> optimizer with the
schedule -> x multipliers [-> zero frozen slices], frozen leaves get `set_to_zero`.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxencoder.model import lora
from jaxencoder.model.encoder import ENCODER, in_embeddings, in_scanned_stack, layer_index

OPTIMIZERS = ("adamw", "adafactor", "lion")
SCHEDULES = ("linear", "cosine", "inverse_sqrt", "constant", "wsd")
DECAY_SHAPES = ("1-sqrt", "linear")  # wsd's final decay


def default_optim_config() -> ml_collections.ConfigDict:
  """Every optimizer key with its default; configs override a few."""
  return ml_collections.ConfigDict(dict(
      name="adamw", learning_rate=1e-4, b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
      decay_embeddings=True, schedule="linear", warmup_steps=0, total_steps=0,
      end_lr_factor=0.0, decay_fraction=0.1, decay_shape="1-sqrt", grad_clip_norm=1.0,
      grad_accum_steps=1, layer_decay=None, lr_multipliers=(), freeze=(), freeze_encoder=False,
      freeze_layers=0, lora_also_train=()))


def make_optimizer(cfg: Mapping[str, Any], params, *, num_layers: int
                   ) -> tuple[optax.GradientTransformation, Callable[[Any], jax.Array]]:
  """(optimizer, lr schedule) for `params` (used for checks and the frozen-slice test)."""
  opts = _resolve(cfg)
  _check_against_params(opts, params, num_layers)
  lr_fn = learning_rate_schedule(opts)
  base = _lora_base(params)
  sliced = _has_frozen_slices(params, opts)
  steps = [_zero_frozen_slices(opts, base)] if sliced else []
  if opts.grad_clip_norm:
    steps.append(optax.clip_by_global_norm(opts.grad_clip_norm))
  steps.append(_base_optimizer(opts, lr_fn))
  steps.append(_scale_by_multipliers(opts, num_layers))
  steps += [_zero_frozen_slices(opts, base)] if sliced else []
  labels = lambda tree: jax.tree_util.tree_map_with_path(
      lambda path, x: "trainable" if np.any(_leaf_trainable(path, x, opts, base)) else "frozen",
      tree)
  tx = optax.partition({"trainable": optax.chain(*steps), "frozen": optax.set_to_zero()},
                       labels)
  return tx, lr_fn


def learning_rate_schedule(cfg: Mapping[str, Any]) -> Callable[[Any], jax.Array]:
  """step -> LR: linear warmup from 0 over warmup_steps, then the named decay."""
  opts = _resolve(cfg)
  _check_schedule(opts)
  peak, warmup, total, end = (opts.learning_rate, opts.warmup_steps, opts.total_steps,
                              opts.end_lr_factor)
  decay_steps = wsd_decay_steps(opts)

  def decayed(step):  # factor in [end, 1] after warmup
    frac = jnp.clip((step - warmup) / max(total - warmup, 1), 0.0, 1.0)
    if opts.schedule == "linear":
      return 1.0 - (1.0 - end) * frac
    if opts.schedule == "cosine":
      return end + (1.0 - end) * 0.5 * (1.0 + jnp.cos(math.pi * frac))
    if opts.schedule == "inverse_sqrt":
      return jnp.sqrt(max(warmup, 1) / jnp.maximum(step, max(warmup, 1)))
    if opts.schedule == "wsd":
      return _wsd_factor(step, total, decay_steps, end, opts.decay_shape)
    return jnp.ones_like(step)

  def lr_fn(step):
    step = jnp.asarray(step, jnp.float32)
    warm = jnp.minimum(1.0, step / warmup) if warmup else 1.0
    return peak * warm * decayed(step)
  return lr_fn


def wsd_decay_steps(cfg: Mapping[str, Any]) -> int:
  """Steps of wsd's final decay: round(decay_fraction * total_steps), at least 1."""
  opts = _resolve(cfg)
  return max(1, round(opts.decay_fraction * opts.total_steps))


def _wsd_factor(step, total: int, decay: int, end: float, shape: str):
  """1 until the decay starts at step total - decay, then down to `end` at total (and
  after): linearly in the decay's progress x, or as 1 - sqrt(x)."""
  x = jnp.clip((step - (total - decay)) / decay, 0.0, 1.0)
  return end + (1.0 - end) * (1.0 - (jnp.sqrt(x) if shape == "1-sqrt" else x))


def param_multipliers(params, cfg: Mapping[str, Any], num_layers: int):
  """LR multiplier per leaf: a float, or a [N, 1, ...] array for a scanned stack."""
  opts = _resolve(cfg)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: _leaf_multiplier(path, x, opts, num_layers), params)


def trainable_mask(params, cfg: Mapping[str, Any]):
  """Per leaf: a bool, or a bool [N] array for a scanned stack partly frozen."""
  opts, base = _resolve(cfg), _lora_base(params)
  return jax.tree_util.tree_map_with_path(
      lambda path, x: _leaf_trainable(path, x, opts, base), params)


def weight_decay_mask(params, cfg: Mapping[str, Any]):
  """Per leaf: True where decoupled weight decay applies."""
  opts = _resolve(cfg)
  return jax.tree_util.tree_map_with_path(lambda path, x: _leaf_decays(path, x, opts), params)


def path_str(path) -> str:
  """'encoder/layers_3/ffn/wi/kernel' for a jax key path."""
  return jax.tree_util.keystr(tuple(path), simple=True, separator="/")


# Per-leaf rules. `path` is a jax key path, `x` the leaf (array or ShapeDtypeStruct).

def _parts(path) -> list[str]:
  return path_str(path).split("/")


def _layer_distance(path, num_layers: int):
  """Distance from the top of the stack: int, or an [N] array for a scanned stack."""
  if in_embeddings(path):
    return num_layers + 1
  if in_scanned_stack(path):
    return num_layers - np.arange(num_layers)
  index = layer_index(path)
  return 0 if index is None else num_layers - index


def _leaf_multiplier(path, x, opts, num_layers: int):
  name = path_str(path)
  regex = next((float(m) for pattern, m in opts.lr_multipliers if re.search(pattern, name)),
               1.0)
  if opts.layer_decay is None:
    return regex
  factor = regex * opts.layer_decay ** _layer_distance(path, num_layers)
  if np.ndim(factor):
    return np.reshape(factor, (num_layers,) + (1,) * (len(x.shape) - 1)).astype(np.float32)
  return float(factor)


def _lora_base(params) -> str | None:
  """The prefix of the params LoRA freezes: "encoder/" (or "" for a bare Encoder's tree)
  when the params hold adapters, else None."""
  if not lora.has_adapters(params):
    return None
  return f"{ENCODER}/" if ENCODER in params else ""


def _leaf_trainable(path, x, opts, lora_base: str | None = None):
  name = path_str(path)
  if any(re.search(pattern, name) for pattern in opts.freeze):
    return False
  if (lora_base is not None and name.startswith(lora_base) and not lora.is_adapter(path)
      and not any(re.search(pattern, name) for pattern in opts.lora_also_train)):
    return False
  if opts.freeze_encoder and name.startswith(f"{ENCODER}/"):
    return False
  k = opts.freeze_layers
  if k and in_embeddings(path):
    return False
  if k and in_scanned_stack(path):
    keep = np.arange(x.shape[0]) >= k
    return bool(keep[0]) if keep.all() or not keep.any() else keep
  index = layer_index(path)
  return index is None or index >= k


def _leaf_decays(path, x, opts) -> bool:
  matrix_rank = len(x.shape) - (1 if in_scanned_stack(path) else 0)
  if _parts(path)[-1] in ("bias", "scale") or matrix_rank <= 1:
    return False
  return opts.decay_embeddings or not in_embeddings(path)


# Transformations.

def _base_optimizer(opts, lr_fn) -> optax.GradientTransformation:
  _check_choice("name", opts.name, OPTIMIZERS)
  decay_mask = lambda tree: weight_decay_mask(tree, opts)
  if opts.name == "adamw":
    return optax.adamw(lr_fn, b1=opts.b1, b2=opts.b2, eps=opts.eps,
                       weight_decay=opts.weight_decay, mask=decay_mask)
  if opts.name == "lion":
    return optax.lion(lr_fn, b1=opts.b1, b2=opts.b2, weight_decay=opts.weight_decay,
                      mask=decay_mask)
  decay_schedule = (lambda step: opts.weight_decay * lr_fn(step)) if opts.weight_decay else None
  return optax.adafactor(lr_fn, weight_decay_rate=decay_schedule, weight_decay_mask=decay_mask)


def _map_updates(fn) -> optax.GradientTransformation:
  """A stateless transformation applying fn(path, update) to each leaf."""
  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(fn, updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def _scale_by_multipliers(opts, num_layers: int) -> optax.GradientTransformation:
  def scale(path, u):
    m = _leaf_multiplier(path, u, opts, num_layers)
    return u if np.all(m == 1.0) else u * jnp.asarray(m, u.dtype)
  return _map_updates(scale)


def _zero_frozen_slices(opts, lora_base: str | None) -> optax.GradientTransformation:
  """Zeros the frozen layer indices of a partly frozen scanned stack."""
  def zero(path, u):
    keep = _leaf_trainable(path, u, opts, lora_base)
    if np.ndim(keep) == 0:
      return u
    return jnp.where(keep.reshape((-1,) + (1,) * (u.ndim - 1)), u, jnp.zeros_like(u))
  return _map_updates(zero)


def _has_frozen_slices(params, opts) -> bool:
  masks = jax.tree.leaves(trainable_mask(params, opts))
  return any(np.ndim(m) for m in masks)


# Config handling.

# key -> (whether a value can be right, the valid range in words). A learning rate <= 0 or
# a negative warmup trains without an error, by gradient ascent or not at all.
_RANGES = {
    "learning_rate": (lambda v: v > 0, "a number > 0"),
    "warmup_steps": (lambda v: isinstance(v, int) and v >= 0, "an integer >= 0"),
    "weight_decay": (lambda v: v >= 0, "a number >= 0 (0: no decay)"),
    "grad_clip_norm": (lambda v: v is None or v >= 0, "a number >= 0 (0 or None: no clipping)"),
    "grad_accum_steps": (lambda v: isinstance(v, int) and v >= 1, "an integer >= 1"),
}


def check(cfg: Mapping[str, Any]) -> None:
  """ValueError in one line for an unknown key or a value that cannot be right: what
  config.finalize (and train.py, before it creates the workdir) asks first."""
  _resolve(cfg)


def _check_ranges(opts) -> None:
  for key, (valid, allowed) in _RANGES.items():
    value = opts[key]
    try:
      ok = valid(value) and not isinstance(value, bool)
    except TypeError:  # e.g. a string
      ok = False
    if not ok:
      raise ValueError(f"optim.{key}={value!r} cannot be right: it must be {allowed}")


def _resolve(cfg: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """Defaults overridden by cfg; unknown keys raise so typos do not pass silently."""
  defaults = default_optim_config().to_dict()
  given = cfg.to_dict() if isinstance(cfg, ml_collections.ConfigDict) else dict(cfg)
  unknown = sorted(set(given) - set(defaults))
  if unknown:
    raise ValueError(f"unknown optimizer config keys {unknown}; allowed: {sorted(defaults)}")
  opts = ml_collections.ConfigDict({**defaults, **given})
  _check_ranges(opts)
  if opts.layer_decay is not None and not 0.0 < opts.layer_decay <= 1.0:
    raise ValueError(f"layer_decay must be None or in (0, 1], got {opts.layer_decay}")
  return opts


def _check_schedule(opts) -> None:
  """The schedule's choices, and room for its warmup (and wsd's decay) in total_steps."""
  _check_choice("schedule", opts.schedule, SCHEDULES)
  _check_choice("decay_shape", opts.decay_shape, DECAY_SHAPES)
  if not 0.0 < opts.decay_fraction <= 1.0:
    raise ValueError(f"optimizer config decay_fraction={opts.decay_fraction!r} must lie in "
                     "(0, 1]: the share of total_steps wsd's final decay takes")
  warmup, total = opts.warmup_steps, opts.total_steps
  if opts.schedule in ("linear", "cosine") and total <= warmup:
    raise ValueError(f"total_steps ({total}) must exceed warmup_steps ({warmup}) for "
                     f"schedule {opts.schedule!r}")
  if opts.schedule == "wsd" and warmup + wsd_decay_steps(opts) > total:
    raise ValueError(f"schedule 'wsd': warmup_steps ({warmup}) + the decay's "
                     f"{wsd_decay_steps(opts)} steps (decay_fraction={opts.decay_fraction} "
                     f"of total_steps) exceed total_steps ({total}): lower warmup_steps or "
                     "decay_fraction, or raise total_steps")


def _check_choice(key: str, value: str, allowed: tuple[str, ...]) -> None:
  if value not in allowed:
    raise ValueError(f"optimizer config {key}={value!r}; allowed values: {allowed}")


def _check_against_params(opts, params, num_layers: int) -> None:
  """Boxed params, regexes that match nothing and a wrong layer count raise."""
  boxed = lambda x: isinstance(x, nn.meta.AxisMetadata)
  if any(boxed(x) for x in jax.tree.leaves(params, is_leaf=boxed)):
    raise ValueError("make_optimizer takes unboxed params: pass nn.meta.unbox(params)")
  leaves = jax.tree_util.tree_leaves_with_path(params)
  names = [path_str(p) for p, _ in leaves]
  for pattern in (list(opts.freeze) + list(opts.lora_also_train)
                  + [pattern for pattern, _ in opts.lr_multipliers]):
    if not any(re.search(pattern, n) for n in names):
      raise ValueError(f"optimizer regex {pattern!r} matches no parameter")
  if opts.freeze_encoder and not any(n.startswith(f"{ENCODER}/") for n in names):
    raise ValueError(f"freeze_encoder=True but no parameter lies under '{ENCODER}/'")
  indices = {i for p, _ in leaves if (i := layer_index(p)) is not None}
  depths = {x.shape[0] for p, x in leaves if in_scanned_stack(p)}
  found = depths or ({max(indices) + 1} if indices else set())
  if found and found != {num_layers}:
    raise ValueError(f"num_layers={num_layers} but params hold a stack of {sorted(found)}")
  if not found and (opts.layer_decay is not None or opts.freeze_layers):
    # Without layers the rules would silently treat every leaf as "above the stack".
    tops = sorted({path_str(p).split("/")[0] for p, _ in leaves})
    raise ValueError("layer_decay / freeze_layers need the encoder's layers, but no parameter "
                     f"path has a looped ('layers_<i>') or scanned ('layers') stack; "
                     f"top-level names: {tops}")
  if opts.freeze_layers > num_layers:
    raise ValueError(f"freeze_layers={opts.freeze_layers} exceeds num_layers={num_layers}")
