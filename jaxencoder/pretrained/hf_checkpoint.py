"""Reading and writing Hugging Face BERT directories (config.json + model.safetensors).

Weights are read with `safetensors.numpy`; nothing is ever unpickled. A directory
with only `pytorch_model.bin` is read through `torch.load(weights_only=True)` when
torch is installed, else rejected with a conversion hint.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from jaxencoder.config import EncoderConfig
from jaxencoder.encoder import ENCODER
from jaxencoder.layout import loop_to_scan, scan_to_loop
from jaxencoder.pretrained import bert_names as names
from jaxencoder.tokenizer import Tokenizer

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TORCH_WEIGHTS = "pytorch_model.bin"
POOLING = pathlib.Path("1_Pooling") / "config.json"  # sentence-transformers' pooling
POOLING_MODES = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                 "max": "pooling_mode_max_tokens"}
Params = dict[str, Any]


def load(path, *, scan_layers: bool = False, dtype: str = "float32",
         pooling: str | None = None) -> tuple[EncoderConfig, Params, Tokenizer | None]:
  """(EncoderConfig, params, tokenizer) of a BertModel / BertForMaskedLM directory.

  params are `Encoder` params, or `{"encoder", "mlm_head"}` (EncoderForMaskedLM)
  when the file holds `cls.predictions.*`; `encoder_params` picks the encoder
  either way. Params and compute use `dtype`. `pooling` defaults to
  sentence-transformers' `1_Pooling/config.json`, else "cls"; BERT's pooler
  (dense + tanh) is kept only with "cls". tokenizer is None without vocab files.
  """
  path = pathlib.Path(path)
  hf = read_json(path / CONFIG)
  tensors = read_tensors(path)
  pooling = pooling or sentence_pooling(path) or "cls"
  prefix = names.PREFIX if any(n.startswith(names.PREFIX) for n in tensors) else ""
  has_pooler = f"{prefix}pooler.dense.weight" in tensors
  cfg = names.encoder_config(hf, pooling=pooling, pooler_dense=has_pooler and pooling == "cls",
                             scan_layers=scan_layers, dtype=dtype, param_dtype=dtype)
  try:
    params = params_from_tensors(cfg, tensors, prefix=prefix)
  except ValueError as e:
    raise ValueError(f"{path / WEIGHTS}: {e}") from None
  return cfg, params, read_tokenizer(path)


def params_from_tensors(cfg: EncoderConfig, tensors: Mapping[str, np.ndarray], *,
                        prefix: str = "") -> Params:
  """Our params (layout per cfg.scan_layers) from HF-named arrays; ValueError names misfits."""
  encoder_slots = names.encoder_slots(cfg, pooler=cfg.pooler_dense, prefix=prefix)
  has_head = any(n.startswith(names.MLM_PREFIX) for n in tensors)
  head_slots = names.mlm_head_slots(cfg) if has_head else []
  skipped = [prefix + b for b in names.BUFFERS]
  if not cfg.pooler_dense:  # BERT's pooler is unused by mean/max pooling
    skipped += [f"{prefix}pooler.dense.weight", f"{prefix}pooler.dense.bias"]
  check_tensors(tensors, encoder_slots + head_slots, skipped, tied=has_head, prefix=prefix)
  dtype = jnp.dtype(cfg.param_dtype)
  encoder = nest((s.path, jnp.asarray(s.to_ours(tensors[s.hf_name]), dtype)) for s in encoder_slots)
  if cfg.scan_layers:
    encoder = loop_to_scan(encoder)
  if not has_head:
    return encoder
  head = nest((s.path, jnp.asarray(s.to_ours(tensors[s.hf_name]), dtype)) for s in head_slots)
  return {ENCODER: encoder, "mlm_head": head}


def check_tensors(tensors: Mapping[str, np.ndarray], slots: list[names.Slot],
                  skipped: list[str], *, tied: bool, prefix: str) -> None:
  """Raises one ValueError naming every missing, unexpected or wrong-shape tensor."""
  expected = {s.hf_name: s.hf_shape for s in slots}
  tied_names = names.TIED_DECODER if tied else {}
  missing = sorted(set(expected) - set(tensors))
  unexpected = sorted(set(tensors) - set(expected) - set(skipped) - set(tied_names))
  wrong = [f"{n}: file {tuple(tensors[n].shape)}, config.json implies {shape}"
           for n, shape in expected.items() if n in tensors and tuple(tensors[n].shape) != shape]
  for name, twin in tied_names.items():
    twin = twin if twin.startswith("cls.") else prefix + twin
    if name in tensors and twin in tensors and not np.array_equal(tensors[name], tensors[twin]):
      wrong.append(f"{name}: differs from {twin}; jaxencoder ties the MLM decoder")
  problems = [f"{label}: {items}" for label, items in
              (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)) if items]
  if problems:
    raise ValueError("checkpoint does not fit its config.json; " + "; ".join(problems))


def encoder_params(params: Params) -> Params:
  """The `Encoder` params of either form `load` returns."""
  return params[ENCODER] if ENCODER in params else params


# ------------------------------------------------------------------ save
def save(path, cfg: EncoderConfig, params: Params, tokenizer: Tokenizer | None = None
         ) -> pathlib.Path:
  """Writes config.json + model.safetensors (float32) (+ 1_Pooling, tokenizer files).

  `params`: Encoder params (saved as a BertModel) or {"encoder", "mlm_head"}
  (saved as a BertForMaskedLM); looped or scanned, boxed or not.
  `transformers.BertModel.from_pretrained(path)` reads the result.
  """
  path = pathlib.Path(path)
  tensors, masked_lm = tensors_from_params(cfg, params)
  path.mkdir(parents=True, exist_ok=True)
  write_json(path / CONFIG, names.hf_config(cfg, masked_lm=masked_lm))
  save_file(tensors, str(path / WEIGHTS), metadata={"format": "pt"})
  if cfg.pooling != "cls":
    modes = {field: cfg.pooling == mode for mode, field in POOLING_MODES.items()}
    write_json(path / POOLING, {"word_embedding_dimension": cfg.emb_dim, **modes})
  if tokenizer is not None:
    tokenizer.save(path)
  return path


def tensors_from_params(cfg: EncoderConfig, params: Params) -> tuple[dict[str, np.ndarray], bool]:
  """HF-named float32 arrays of our params, and whether they include the MLM head."""
  names.check_bert_compatible(cfg)
  params = scan_to_loop(nn.meta.unbox(params))
  masked_lm = "mlm_head" in params
  encoder = encoder_params(params)
  slots = names.encoder_slots(cfg, pooler="pooler" in encoder,
                              prefix=names.PREFIX if masked_lm else "")
  head_slots = names.mlm_head_slots(cfg) if masked_lm else []
  pairs = [(s, encoder) for s in slots] + [(s, params.get("mlm_head")) for s in head_slots]
  wanted = {s.path for s in slots}
  if masked_lm:
    wanted = {(ENCODER,) + p for p in wanted} | {("mlm_head",) + s.path for s in head_slots}
  present = set(flatten(params))
  for label, paths in (("params with no BERT name", present - wanted),
                       ("params missing", wanted - present)):
    if paths:
      raise ValueError(f"{label}: {sorted('/'.join(p) for p in paths)}")
  tensors = {s.hf_name: s.to_hf(np.asarray(get(tree, s.path), np.float32)) for s, tree in pairs}
  return tensors, masked_lm


# ------------------------------------------------------------------ files
def read_json(file: pathlib.Path) -> dict[str, Any]:
  if not file.is_file():
    raise FileNotFoundError(f"{file}: not found (a BERT directory needs {file.name})")
  return json.loads(file.read_text(encoding="utf-8"))


def write_json(file: pathlib.Path, value: Mapping[str, Any]) -> None:
  file.parent.mkdir(parents=True, exist_ok=True)
  file.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def read_tensors(path: pathlib.Path) -> dict[str, np.ndarray]:
  """All tensors of model.safetensors (or its shards, or a torch .bin via weights_only)."""
  if (path / WEIGHTS).is_file():
    return load_file(str(path / WEIGHTS))
  if (path / WEIGHTS_INDEX).is_file():
    shards = sorted(set(read_json(path / WEIGHTS_INDEX)["weight_map"].values()))
    return {k: v for shard in shards for k, v in load_file(str(path / shard)).items()}
  if (path / TORCH_WEIGHTS).is_file():
    return read_torch_weights(path / TORCH_WEIGHTS)
  raise FileNotFoundError(f"{path / WEIGHTS}: not found (nor {WEIGHTS_INDEX} or {TORCH_WEIGHTS})")


def read_torch_weights(file: pathlib.Path) -> dict[str, np.ndarray]:
  """A torch state dict read with weights_only=True (no arbitrary unpickling)."""
  try:
    import torch  # pylint: disable=import-outside-toplevel
  except ImportError:
    raise ValueError(
        f"{file}: only a PyTorch pickle is here, and jaxencoder never unpickles. Convert it "
        "to safetensors first, e.g. with transformers installed: python -c \"import transformers "
        f"as t; t.AutoModel.from_pretrained('{file.parent}').save_pretrained('{file.parent}')\" "
        "(use BertForMaskedLM to keep an MLM head), or install torch to read it with "
        "torch.load(weights_only=True).") from None
  state = torch.load(str(file), map_location="cpu", weights_only=True)
  return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()}


def sentence_pooling(path: pathlib.Path) -> str | None:
  """'cls' / 'mean' / 'max' from sentence-transformers' 1_Pooling/config.json, if present."""
  file = pathlib.Path(path) / POOLING
  if not file.is_file():
    return None
  modes = read_json(file)
  chosen = [mode for mode, field in POOLING_MODES.items() if modes.get(field)]
  others = [k for k, v in modes.items() if k.startswith("pooling_mode") and v
            and k not in POOLING_MODES.values()]
  if len(chosen) != 1 or others:
    raise ValueError(f"{file}: jaxencoder supports exactly one of {sorted(POOLING_MODES)} "
                     f"pooling, got {chosen + others}")
  return chosen[0]


def read_tokenizer(path: pathlib.Path) -> Tokenizer | None:
  if (path / "tokenizer.json").is_file() or (path / "vocab.txt").is_file():
    return Tokenizer.from_file(path)
  return None


# ------------------------------------------------------------------ nested dicts
def nest(items) -> Params:
  """{(a, b, c): x} pairs -> {a: {b: {c: x}}}."""
  tree: Params = {}
  for path, value in items:
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
  return tree


def flatten(tree: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
  out = {}
  for key, value in tree.items():
    if isinstance(value, Mapping):
      out.update(flatten(value, prefix + (key,)))
    else:
      out[prefix + (key,)] = value
  return out


def get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
  for key in path:
    tree = tree[key]
  return tree
