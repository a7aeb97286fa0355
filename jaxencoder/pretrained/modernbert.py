"""ModernBERT checkpoints (Hugging Face layout) <-> jaxencoder.

ModernBERT is a pre-norm RoPE encoder: token embeddings + LayerNorm, no position or
type tables; fused Wqkv and GeGLU Wi ([input; gate], out = Wo(act(input) * gate));
global attention in layers i % n == 0, a sliding window |i - j| <= local_attention // 2
elsewhere, each kind with its own RoPE base; layer 0 attends to its input unnormalised.
Fused tensors are split into virtual names (`...Wqkv.weight#q`) so that every slot is
one of our params; `save` joins them back. Facts from transformers' modeling_modernbert.
"""

from __future__ import annotations

import dataclasses
import logging
import pathlib
import re
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import EMBEDDINGS, ENCODER, layer_name
from jaxencoder.model.stack_layout import loop_to_scan, scan_to_loop
from jaxencoder.pretrained.bert_names import Slot, config_mismatches, dense_slots, norm_slots
from jaxencoder.pretrained.hf_checkpoint import (CONFIG, WEIGHTS, check_tensors, flatten, get,
                                                 nest, read_json, read_tensors,
                                                 sentence_pooling, write_directory)
from jaxencoder.tokenizer import Tokenizer

log = logging.getLogger(__name__)
Params = dict[str, Any]

PREFIX = "model."  # ModernBertForMaskedLM wraps the encoder under it
HEAD_PREFIXES = ("head.", "decoder.")
# HF hidden_activation -> our gated activation (ACT2FN "gelu" is the exact erf GELU).
HF_ACTIVATIONS = {"gelu": "geglu", "silu": "swiglu", "swish": "swiglu"}
OUR_ACTIVATIONS = {"geglu": "gelu", "swiglu": "silu"}
FULL, SLIDING = "full_attention", "sliding_attention"
# config.json's special ids and the tokens they are (ModernBERT's, then RoBERTa-style ones).
SPECIAL_TOKENS = {"pad_token_id": ("[PAD]", "<pad>"), "cls_token_id": ("[CLS]", "<s>"),
                  "bos_token_id": ("[CLS]", "<s>"), "sep_token_id": ("[SEP]", "</s>"),
                  "eos_token_id": ("[SEP]", "</s>")}
# Fused HF tensors: name pattern -> parts in row order (Wi: input is activated, gate is not).
FUSED = {re.compile(r"\.attn\.Wqkv\.(weight|bias)$"): ("q", "k", "v"),
         re.compile(r"\.mlp\.Wi\.(weight|bias)$"): ("input", "gate")}


# ------------------------------------------------------------------ config.json
def encoder_config(hf: Mapping[str, Any], **overrides: Any) -> EncoderConfig:
  """EncoderConfig of a ModernBertConfig dict; one ValueError names everything unsupported."""
  bad = []
  if hf.get("model_type") != "modernbert":
    bad.append(f"model_type={hf.get('model_type')!r} (expected 'modernbert')")
  act = hf.get("hidden_activation", "gelu")
  if act not in HF_ACTIVATIONS:
    bad.append(f"hidden_activation={act!r} (supported: {sorted(HF_ACTIVATIONS)})")
  if hf.get("attention_bias", False) != hf.get("mlp_bias", False):
    bad.append(f"attention_bias={hf.get('attention_bias')} != mlp_bias={hf.get('mlp_bias')} "
               "(jaxencoder has one use_bias)")
  if hf.get("head_dim") not in (None, hf["hidden_size"] // hf["num_attention_heads"]):
    bad.append(f"head_dim={hf['head_dim']} (ModernBERT: hidden_size / num_attention_heads)")
  types = hf.get("layer_types") or _legacy_layer_types(hf)
  every = _global_every(types)
  if every is None:
    bad.append(f"layer_types={types} (jaxencoder: full_attention exactly in layers i % n == 0)")
  thetas, scaling, rope_bad = _rope_thetas(hf)
  bad += rope_bad
  if bad:
    raise ValueError("config.json: unsupported ModernBERT options: " + "; ".join(bad))
  local_window = hf.get("local_attention", 128) // 2
  fields = dict(
      vocab_size=hf["vocab_size"], type_vocab_size=0, num_layers=hf["num_hidden_layers"],
      emb_dim=hf["hidden_size"], num_heads=hf["num_attention_heads"],
      mlp_dim=hf["intermediate_size"], max_len=hf.get("max_position_embeddings", 8192),
      position_embedding="rope", embedding_norm=True, activation=HF_ACTIVATIONS[act],
      norm="layernorm", norm_position="pre", norm_eps=hf.get("norm_eps", 1e-5),
      use_bias=hf.get("attention_bias", False), norm_bias=hf.get("norm_bias", False),
      first_attention_norm=False, sliding_window=local_window, global_attention_every=every,
      rope_base=thetas[FULL] if every else thetas[SLIDING],
      local_rope_base=thetas[SLIDING] if every else None, rope_scaling=scaling,
      dropout_rate=hf.get("embedding_dropout", 0.0),
      attention_dropout_rate=hf.get("attention_dropout", 0.0),
      mlp_dropout_rate=hf.get("mlp_dropout", 0.0),
      initializer_range=hf.get("initializer_range", 0.02), family="modernbert")
  fields.update(overrides)
  return EncoderConfig.from_dict(fields)


def _legacy_layer_types(hf: Mapping[str, Any]) -> list[str]:
  """Pre-`layer_types` configs (most on the Hub): global_attn_every_n_layers (default 3)."""
  n = hf.get("global_attn_every_n_layers", 3)
  return [SLIDING if i % n else FULL for i in range(hf["num_hidden_layers"])]


def _global_every(types: list[str]) -> int | None:
  """n with layer i global iff i % n == 0 (0: every layer local); None if no such n."""
  if all(t == SLIDING for t in types):
    return 0
  for n in range(1, len(types) + 1):
    if types == [SLIDING if i % n else FULL for i in range(len(types))]:
      return n
  return None


def _rope_thetas(hf: Mapping[str, Any]) -> tuple[dict[str, float], float, list[str]]:
  """RoPE base per layer kind (rope_parameters, else the legacy *_rope_theta), the linear
  scaling factor (one for both kinds: jaxencoder's rope_scaling), problems."""
  params = hf.get("rope_parameters") or {}
  legacy = {FULL: hf.get("global_rope_theta", 160_000.0),
            SLIDING: hf.get("local_rope_theta", 10_000.0)}
  thetas, factors, bad = {}, set(), []
  if hf.get("rope_scaling"):  # the legacy key; new configs fold it into rope_parameters
    params = {k: {**(params.get(k) or {}), **hf["rope_scaling"]} for k in (FULL, SLIDING)}
  for kind in (FULL, SLIDING):
    p = params.get(kind) or {}
    rope_type = p.get("rope_type", p.get("type", "default"))
    if rope_type not in ("default", "linear"):
      bad.append(f"rope_parameters[{kind!r}].rope_type={rope_type!r} (only default, linear)")
    factors.add(float(p.get("factor", 1.0)) if rope_type == "linear" else 1.0)
    thetas[kind] = float(p.get("rope_theta", legacy[kind]))
  if len(factors) > 1:
    bad.append(f"linear RoPE factors {sorted(factors)} differ per layer kind (jaxencoder: one)")
  return thetas, max(factors), bad


def hf_config(cfg: EncoderConfig, *, masked_lm: bool,
              special_ids: Mapping[str, int | None] | None = None) -> dict[str, Any]:
  """ModernBertConfig fields of an EncoderConfig (new and legacy pattern / RoPE keys)."""
  check_modernbert_compatible(cfg)
  every = cfg.global_attention_every
  if every:
    types = [SLIDING if i % every else FULL for i in range(cfg.num_layers)]
  else:
    types = [FULL if cfg.sliding_window is None else SLIDING] * cfg.num_layers
  local_base = cfg.rope_base if cfg.local_rope_base is None else cfg.local_rope_base
  fields = {
      "architectures": ["ModernBertForMaskedLM" if masked_lm else "ModernBertModel"],
      "model_type": "modernbert", "vocab_size": cfg.vocab_size, "hidden_size": cfg.emb_dim,
      "intermediate_size": cfg.resolved_mlp_dim, "num_hidden_layers": cfg.num_layers,
      "num_attention_heads": cfg.num_heads, "hidden_activation": OUR_ACTIVATIONS[cfg.activation],
      "max_position_embeddings": cfg.max_len, "initializer_range": cfg.initializer_range,
      "norm_eps": cfg.norm_eps, "norm_bias": cfg.norm_bias, "attention_bias": cfg.use_bias,
      "mlp_bias": cfg.use_bias, "classifier_bias": cfg.use_bias, "decoder_bias": True,
      "classifier_activation": "gelu", "tie_word_embeddings": True,
      "embedding_dropout": cfg.dropout_rate, "attention_dropout": cfg.attention_dropout_rate,
      "mlp_dropout": cfg.mlp_dropout_rate,
      "classifier_pooling": "mean" if cfg.pooling == "mean" else "cls",
      "local_attention": 2 * (cfg.sliding_window if cfg.sliding_window is not None else 64),
      "layer_types": types,
      "rope_parameters": {FULL: _rope_params(cfg, cfg.rope_base),
                          SLIDING: _rope_params(cfg, local_base)},
      "global_rope_theta": cfg.rope_base, "local_rope_theta": local_base,
      **(special_ids or {key: None for key in SPECIAL_TOKENS}),
  }
  if every:
    fields["global_attn_every_n_layers"] = every
  return fields


def _rope_params(cfg: EncoderConfig, theta: float) -> dict[str, Any]:
  if cfg.rope_scaling == 1.0:
    return {"rope_type": "default", "rope_theta": theta}
  return {"rope_type": "linear", "factor": cfg.rope_scaling, "rope_theta": theta}


def check_modernbert_compatible(cfg: EncoderConfig) -> None:
  """Raises ValueError listing every field a ModernBERT checkpoint cannot represent."""
  wanted = {"input_kind": "text", "position_embedding": "rope", "type_vocab_size": 0,
            "embedding_norm": True, "scale_embeddings": False, "norm": "layernorm",
            "norm_position": "pre", "first_attention_norm": False, "causal": False,
            "pooler_dense": False}
  wanted.update(embedding_dim=None, position_offset=0)
  bad = config_mismatches(cfg, "ModernBERT", wanted, OUR_ACTIVATIONS)
  if cfg.pooling == "attention":
    bad.append("pooling='attention' (ModernBERT: cls or mean)")
  if bad:
    raise ValueError("this EncoderConfig has no ModernBERT equivalent: " + "; ".join(bad))


# ------------------------------------------------------------------ tensors
def _dense(hf: str, path: tuple[str, ...], n_in: tuple[int, ...], n_out: tuple[int, ...],
           bias: bool, part: str = "") -> list[Slot]:
  slots = dense_slots(hf, path, n_in, n_out)[:2 if bias else 1]
  return [dataclasses.replace(s, hf_name=s.hf_name + part) for s in slots]


def _norm(hf: str, path: tuple[str, ...], d: int, bias: bool) -> list[Slot]:
  return norm_slots(hf, path, d)[:2 if bias else 1]


def encoder_slots(cfg: EncoderConfig, prefix: str = "") -> list[Slot]:
  """Slots of ModernBertModel (fused tensors as their parts), looped layout."""
  d, f, h, k = cfg.emb_dim, cfg.resolved_mlp_dim, cfg.num_heads, cfg.resolved_head_dim
  b, nb = cfg.use_bias, cfg.norm_bias
  slots = [Slot("embeddings.tok_embeddings.weight", (cfg.vocab_size, d),
                (EMBEDDINGS, "token_embed", "embedding"), (cfg.vocab_size, d)),
           *_norm("embeddings.norm", (EMBEDDINGS, "norm"), d, nb)]
  for i in range(cfg.num_layers):
    hf, ours = f"layers.{i}", layer_name(i)
    if i:  # layer 0's attn_norm is nn.Identity
      slots += _norm(f"{hf}.attn_norm", (ours, "attention_norm"), d, nb)
    for part, name in zip(("q", "k", "v"), ("query", "key", "value")):
      slots += _dense(f"{hf}.attn.Wqkv", (ours, "attention", name), (d,), (h, k), b, f"#{part}")
    slots += _dense(f"{hf}.attn.Wo", (ours, "attention", "out"), (h, k), (d,), b)
    slots += _norm(f"{hf}.mlp_norm", (ours, "ffn_norm"), d, nb)
    # HF act(input) * gate is our act(wi_gate) * wi_up: its "input" is our activated half.
    slots += _dense(f"{hf}.mlp.Wi", (ours, "ffn", "wi_gate"), (d,), (f,), b, "#input")
    slots += _dense(f"{hf}.mlp.Wi", (ours, "ffn", "wi_up"), (d,), (f,), b, "#gate")
    slots += _dense(f"{hf}.mlp.Wo", (ours, "ffn", "wo"), (f,), (d,), b)
  slots += _norm("final_norm", ("final_norm",), d, nb)
  return [dataclasses.replace(s, hf_name=prefix + s.hf_name) for s in slots]


def mlm_head_slots(cfg: EncoderConfig) -> list[Slot]:
  """ModernBertForMaskedLM's head (dense, norm) and decoder bias; the decoder is tied."""
  d = cfg.emb_dim
  return [*_dense("head.dense", ("transform",), (d,), (d,), cfg.use_bias),
          *_norm("head.norm", ("norm",), d, cfg.norm_bias),
          Slot("decoder.bias", (cfg.vocab_size,), ("bias",), (cfg.vocab_size,))]


def split_fused(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Wqkv / Wi split row-wise into their parts, named `<name>#<part>`."""
  out = {}
  for name, tensor in tensors.items():
    parts = next((p for pattern, p in FUSED.items() if pattern.search(name)), None)
    if parts is None or tensor.shape[0] % len(parts):
      out[name] = tensor
      continue
    for part, piece in zip(parts, np.split(tensor, len(parts), axis=0)):
      out[f"{name}#{part}"] = piece
  return out


def join_fused(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Inverse of split_fused."""
  out, groups = {}, {}
  for name, tensor in tensors.items():
    base, _, part = name.partition("#")
    if part:
      groups.setdefault(base, {})[part] = tensor
    else:
      out[name] = tensor
  for base, pieces in groups.items():
    order = next(p for pattern, p in FUSED.items() if pattern.search(base))
    out[base] = np.concatenate([pieces[p] for p in order], axis=0)
  return out


# ------------------------------------------------------------------ load
def load(path: pathlib.Path, *, scan_layers: bool = False, dtype: str = "float32",
         pooling: str | None = None) -> tuple[EncoderConfig, Params, Tokenizer | None]:
  """(EncoderConfig, params, tokenizer) of a ModernBertModel / ModernBertForMaskedLM dir.

  params are `Encoder` params, or {"encoder", "mlm_head"} when the file holds the MLM
  head and jaxencoder's MlmHead can express it (tied decoder, gelu, classifier_bias ==
  attention_bias; decoder_bias false loads as a zero bias); else the head is skipped with
  a logged reason. `pooling`: else 1_Pooling/config.json, else classifier_pooling.
  """
  path = pathlib.Path(path)
  hf = read_json(path / CONFIG)
  tensors = split_fused(read_tensors(path))
  pooling = pooling or sentence_pooling(path) or hf.get("classifier_pooling", "cls")
  cfg = encoder_config(hf, pooling=pooling, scan_layers=scan_layers, dtype=dtype,
                       param_dtype=dtype)
  try:
    params = params_from_tensors(cfg, tensors, hf)
  except ValueError as e:
    raise ValueError(f"{path / WEIGHTS}: {e}") from None
  tokenizer = Tokenizer.from_file(path) if (path / "tokenizer.json").is_file() else None
  return cfg, params, tokenizer


def _head_obstacles(hf: Mapping[str, Any], cfg: EncoderConfig,
                    tensors: Mapping[str, np.ndarray], prefix: str) -> list[str]:
  bad = []
  if hf.get("classifier_activation", "gelu") != "gelu":
    bad.append(f"classifier_activation={hf['classifier_activation']!r} (MlmHead: gelu)")
  if hf.get("classifier_bias", False) != cfg.use_bias:
    bad.append(f"classifier_bias={hf.get('classifier_bias')} != attention_bias={cfg.use_bias}")
  table = tensors.get(prefix + "embeddings.tok_embeddings.weight")
  decoder = tensors.get("decoder.weight")
  if not hf.get("tie_word_embeddings", True) or (
      decoder is not None and table is not None and not np.array_equal(decoder, table)):
    bad.append("an untied decoder (MlmHead ties it to the token embeddings)")
  return bad


def params_from_tensors(cfg: EncoderConfig, tensors: Mapping[str, np.ndarray],
                        hf: Mapping[str, Any]) -> Params:
  """Our params (layout per cfg.scan_layers) from split HF arrays; ValueError names misfits."""
  prefix = PREFIX if any(n.startswith(PREFIX) for n in tensors) else ""
  has_head = any(n.startswith(HEAD_PREFIXES) for n in tensors)
  obstacles = _head_obstacles(hf, cfg, tensors, prefix) if has_head else []
  if obstacles:
    log.warning("ModernBERT MLM head not loaded (encoder only): %s", "; ".join(obstacles))
  with_head = has_head and not obstacles
  encoder_slots_ = encoder_slots(cfg, prefix)
  head_slots = mlm_head_slots(cfg) if with_head else []
  if with_head and "decoder.bias" not in tensors:  # decoder_bias false: a zero bias
    tensors = {**tensors, "decoder.bias": np.zeros(cfg.vocab_size, np.float32)}
  skipped = [n for n in tensors if n.startswith(HEAD_PREFIXES) and not with_head]
  tied = {"decoder.weight": prefix + "embeddings.tok_embeddings.weight"} if with_head else {}
  check_tensors(tensors, encoder_slots_ + head_slots, skipped, tied=tied)
  dtype = jnp.dtype(cfg.param_dtype)
  to_ours = lambda slots: nest((s.path, jnp.asarray(s.to_ours(tensors[s.hf_name]), dtype))
                               for s in slots)
  encoder = to_ours(encoder_slots_)
  first = encoder[layer_name(0)]  # unused by layer 0, kept for one stacked layout
  first["attention_norm"] = {"scale": jnp.ones(cfg.emb_dim, dtype)}
  if cfg.norm_bias:
    first["attention_norm"]["bias"] = jnp.zeros(cfg.emb_dim, dtype)
  if cfg.scan_layers:
    encoder = loop_to_scan(encoder)
  return {ENCODER: encoder, "mlm_head": to_ours(head_slots)} if with_head else encoder


# ------------------------------------------------------------------ save
def save(path: pathlib.Path, cfg: EncoderConfig, params: Params,
         tokenizer: Tokenizer | None = None) -> pathlib.Path:
  """Writes config.json + model.safetensors (float32) (+ 1_Pooling, tokenizer files).

  `params`: Encoder params (a ModernBertModel) or {"encoder", "mlm_head"} (a
  ModernBertForMaskedLM); looped or scanned, boxed or not.
  """
  tensors, masked_lm = tensors_from_params(cfg, params)
  config = hf_config(cfg, masked_lm=masked_lm, special_ids=special_token_ids(tokenizer))
  return write_directory(path, cfg, config, tensors, tokenizer)


def special_token_ids(tokenizer: Tokenizer | None) -> dict[str, int | None]:
  """config.json's special ids from the tokenizer's vocabulary (None where unknown)."""
  find = lambda tokens: next((i for t in tokens if tokenizer is not None
                              and (i := tokenizer.hf.token_to_id(t)) is not None), None)
  return {key: find(tokens) for key, tokens in SPECIAL_TOKENS.items()}


def tensors_from_params(cfg: EncoderConfig, params: Params) -> tuple[dict[str, np.ndarray], bool]:
  """HF-named float32 arrays of our params, and whether they include the MLM head."""
  check_modernbert_compatible(cfg)
  params = scan_to_loop(nn.meta.unbox(params))
  masked_lm = "mlm_head" in params
  encoder = params[ENCODER] if masked_lm else params
  slots = encoder_slots(cfg, PREFIX if masked_lm else "")
  head_slots = mlm_head_slots(cfg) if masked_lm else []
  pairs = [(s, encoder) for s in slots] + [(s, params.get("mlm_head")) for s in head_slots]
  # Layer 0's attention_norm is unused (HF: nn.Identity): allowed, never written.
  unused = {(layer_name(0), "attention_norm", k) for k in ("scale", "bias")}
  wanted = {s.path for s in slots}
  if masked_lm:
    unused = {(ENCODER,) + p for p in unused}
    wanted = {(ENCODER,) + p for p in wanted} | {("mlm_head",) + s.path for s in head_slots}
  present = set(flatten(params))
  for label, paths in (("params with no ModernBERT name", present - wanted - unused),
                       ("params missing", wanted - present)):
    if paths:
      raise ValueError(f"{label}: {sorted('/'.join(p) for p in paths)}")
  tensors = {s.hf_name: s.to_hf(np.asarray(get(tree, s.path), np.float32)) for s, tree in pairs}
  return join_fused(tensors), masked_lm
