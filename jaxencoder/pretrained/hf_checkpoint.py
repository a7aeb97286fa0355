"""Reading and writing Hugging Face encoder directories (config.json + model.safetensors).

`load` picks the family from config.json's `model_type`, `save` from cfg.family
(FAMILY_MODULES). bert, roberta, distilbert and electra are tables of names
(`bert_names.Layout`) read and written here; other families' modules bring their own
`load(path, *, scan_layers, dtype, pooling)` and `save(path, cfg, params, tokenizer)`.

Weights are read with `safetensors.numpy`; nothing is ever unpickled. A directory
with only `pytorch_model.bin` is read through `torch.load(weights_only=True)` when
torch is installed, else rejected with a conversion hint.
"""

from __future__ import annotations

import importlib
import json
import logging
import pathlib
from types import ModuleType
from typing import Any, Mapping

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from jaxencoder import cli
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import ENCODER
from jaxencoder.model.stack_layout import loop_to_scan, scan_to_loop
from jaxencoder.pretrained import bert_names as names
from jaxencoder.pretrained.resize import resize_positions
from jaxencoder.pretrained.resolver import HF_CONFIG, hf_dir
from jaxencoder.tokenizer import HF_SPECIAL_IDS, Tokenizer, check_fits

log = logging.getLogger(__name__)
CONFIG = HF_CONFIG
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TORCH_WEIGHTS = "pytorch_model.bin"
POOLING = pathlib.Path("1_Pooling") / "config.json"  # sentence-transformers' pooling
POOLING_MODES = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens",
                 "max": "pooling_mode_max_tokens"}
# model_type -> the module that reads and writes it (imported when first used). Its
# `LAYOUT` (a names table), or else its own `load` and `save`.
FAMILY_MODULES = {
    "bert": "jaxencoder.pretrained.bert_names",
    "roberta": "jaxencoder.pretrained.roberta_names",
    "distilbert": "jaxencoder.pretrained.distilbert_names",
    "electra": "jaxencoder.pretrained.electra_names",
    "modernbert": "jaxencoder.pretrained.modernbert",
    "vit": "jaxencoder.pretrained.vit",
}
Params = dict[str, Any]


def family_module(family: str, where: str = "config.json") -> ModuleType:
  """The module of a family (a model_type); one ValueError naming the supported ones."""
  if family not in FAMILY_MODULES:
    hint = cli.did_you_mean(family, FAMILY_MODULES)
    raise ValueError(f"{where}: model_type={family!r} is not supported; "
                     f"{hint + ' ' if hint else ''}supported: {sorted(FAMILY_MODULES)}")
  return importlib.import_module(FAMILY_MODULES[family])


def load(path, *, scan_layers: bool = False, dtype: str = "float32",
         pooling: str | None = None, max_len: int | None = None,
         image_size: tuple[int, int] | None = None
         ) -> tuple[EncoderConfig, Params, Tokenizer | None]:
  """(EncoderConfig, params, tokenizer) of a Hugging Face encoder directory (or a registered
  name: "minilm"; a run directory is one line naming jaxencoder.load, which reads both).

  params are `Encoder` params, or `{"encoder", head}` when the file holds a head
  (BertForMaskedLM & co: "mlm_head"; ElectraForPreTraining: "discriminator_head");
  `encoder_params` picks the encoder either way. Params and compute use `dtype`.
  `pooling` defaults to sentence-transformers' `1_Pooling/config.json`, else "cls";
  BERT's pooler (dense + tanh) is kept only with "cls". tokenizer is None without
  tokenizer files. Opt-in, with a warning (see `resize_on_load`): `max_len` (text) extends
  the position table to that many rows, `image_size` (ViT) resamples the position grid.
  """
  path = pathlib.Path(hf_dir(path, "pretrained.load"))
  hf = read_json(path / CONFIG)
  module = family_module(hf.get("model_type", "bert"), str(path / CONFIG))
  if hasattr(module, "LAYOUT"):
    cfg, params, tokenizer = _load_layout(path, hf, module.LAYOUT, scan_layers=scan_layers,
                                          dtype=dtype, pooling=pooling)
  else:
    cfg, params, tokenizer = module.load(path, scan_layers=scan_layers, dtype=dtype,
                                         pooling=pooling)
  cfg, params = resize_on_load(cfg, params, max_len=max_len, image_size=image_size)
  return cfg, params, tokenizer


def resize_on_load(cfg: EncoderConfig, params: Params, *, max_len: int | None = None,
                   image_size: tuple[int, int] | None = None) -> tuple[EncoderConfig, Params]:
  """(cfg, params) serving `max_len` positions or `image_size` images; unchanged when they
  already do (or both are None).

  A learned text table shorter than `max_len` rows (EncoderConfig.max_len; RoBERTa's count
  its offset rows) is extended by interpolation (`resize.resize_positions`, logs a
  warning); a longer one is kept (never shrunk). Without a table (rope, sinusoidal) there
  is nothing to resize: only cfg.max_len is raised, with a warning that positions past the
  trained length are extrapolated (for rope see rope_scaling). An `image_size` other than
  cfg's resamples a ViT grid; `image_size` on a text encoder, or `max_len` on an image
  one, is a ValueError.
  """
  if image_size is not None and (cfg.input_kind != "image"
                                 or tuple(image_size) != tuple(cfg.image_size)):
    cfg, params = resize_positions(cfg, params, image_size=tuple(image_size))
  if max_len is None:
    return cfg, params
  if cfg.input_kind != "text":
    raise ValueError(f"max_len={max_len} sets the text length; this encoder has "
                     f"input_kind={cfg.input_kind!r} (images: image_size)")
  if max_len <= cfg.max_len:
    return cfg, params
  if cfg.position_embedding == "learned":
    return resize_positions(cfg, params, max_len=max_len)
  log.warning("max_len %d -> %d: %s positions have no table to resize; positions past %d "
              "were never trained (for rope see rope_scaling)", cfg.max_len, max_len,
              cfg.position_embedding, cfg.max_len)
  return cfg.replace(max_len=max_len), params


def _load_layout(path: pathlib.Path, hf: Mapping[str, Any], layout: names.Layout, *,
                 scan_layers: bool, dtype: str, pooling: str | None
                 ) -> tuple[EncoderConfig, Params, Tokenizer | None]:
  """A family read through its names table (bert, roberta, distilbert, electra)."""
  tensors = read_tensors(path)
  pooling = pooling or sentence_pooling(path) or "cls"
  prefix = layout.prefix if any(n.startswith(layout.prefix) for n in tensors) else ""
  has_pooler = layout.pooler and f"{prefix}pooler.dense.weight" in tensors
  cfg = layout.encoder_config(hf, pooling=pooling, pooler_dense=has_pooler and pooling == "cls",
                              scan_layers=scan_layers, dtype=dtype, param_dtype=dtype)
  try:
    params = params_from_tensors(cfg, tensors, prefix=prefix)
  except ValueError as e:
    raise ValueError(f"{path / WEIGHTS}: {e}") from None
  return cfg, params, read_tokenizer(path)


def layout_of(cfg: EncoderConfig) -> names.Layout:
  module = family_module(cfg.family, "EncoderConfig.family")
  if not hasattr(module, "LAYOUT"):
    raise ValueError(f"family={cfg.family!r} has no names table; use its module's load / save")
  return module.LAYOUT


def params_from_tensors(cfg: EncoderConfig, tensors: Mapping[str, np.ndarray], *,
                        prefix: str = "") -> Params:
  """Our params (layout per cfg.scan_layers) from HF-named arrays of cfg.family;
  ValueError names misfits."""
  layout = layout_of(cfg)
  encoder_slots = layout.encoder_slots(cfg, pooler=cfg.pooler_dense, prefix=prefix)
  heads = [h for h in layout.heads if any(n.startswith(h.marker) for n in tensors)]
  if len(heads) > 1:
    raise ValueError(f"holds {len(heads)} heads {[h.marker for h in heads]}; jaxencoder reads one")
  head = heads[0] if heads else None
  if head is not None and head.activation not in (None, cfg.activation):
    raise ValueError(f"its head applies {head.activation}, but jaxencoder's head uses the "
                     f"encoder's activation {cfg.activation!r}")
  head_slots = head.slots(cfg) if head else []
  skipped = [prefix + b for b in layout.buffers]
  if not cfg.pooler_dense:  # BERT's pooler is unused by mean/max pooling
    skipped += [f"{prefix}pooler.dense.weight", f"{prefix}pooler.dense.bias"]
  check_tensors(tensors, encoder_slots + head_slots, skipped,
                head.tied(prefix) if head else {})
  dtype = jnp.dtype(cfg.param_dtype)
  encoder = nest((s.path, jnp.asarray(s.to_ours(tensors[s.hf_name]), dtype)) for s in encoder_slots)
  if cfg.scan_layers:
    encoder = loop_to_scan(encoder)
  if head is None:
    return encoder
  head_params = nest((s.path, jnp.asarray(s.to_ours(tensors[s.hf_name]), dtype))
                     for s in head_slots)
  return {ENCODER: encoder, head.key: head_params}


def check_tensors(tensors: Mapping[str, np.ndarray], slots: list[names.Slot],
                  skipped: list[str], tied: Mapping[str, str]) -> None:
  """Raises one ValueError naming every missing, unexpected or wrong-shape tensor.

  `tied`: {name: twin} pairs that may be stored twice (then they must be equal).
  """
  expected = {s.hf_name: s.hf_shape for s in slots}
  missing = sorted(set(expected) - set(tensors))
  unexpected = sorted(set(tensors) - set(expected) - set(skipped) - set(tied))
  wrong = [f"{n}: file {tuple(tensors[n].shape)}, config.json implies {shape}"
           for n, shape in expected.items() if n in tensors and tuple(tensors[n].shape) != shape]
  for name, twin in tied.items():
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
  """Writes config.json + model.safetensors (float32) (+ 1_Pooling, tokenizer files)
  in cfg.family's layout.

  `params`: Encoder params (saved as e.g. BertModel) or {"encoder", head} (saved as
  e.g. BertForMaskedLM, ElectraForPreTraining); looped or scanned, boxed or not.
  transformers' `from_pretrained(path)` reads the result.
  """
  path = pathlib.Path(path)
  module = family_module(cfg.family, "EncoderConfig.family")
  if not hasattr(module, "LAYOUT"):
    return module.save(path, cfg, params, tokenizer)
  tensors, head = tensors_from_params(cfg, params)
  layout = module.LAYOUT
  architecture = layout.head(head).architecture if head else layout.architecture
  config = {"architectures": [architecture], **layout.hf_config(cfg)}
  return write_directory(path, cfg, config, tensors, tokenizer)


def write_directory(path, cfg: EncoderConfig, config: Mapping[str, Any],
                    tensors: Mapping[str, np.ndarray], tokenizer: Tokenizer | None = None
                    ) -> pathlib.Path:
  """Any family's directory: config.json, model.safetensors, 1_Pooling/config.json when
  cfg pools other than by [CLS], and the tokenizer's files."""
  path = pathlib.Path(path)
  path.mkdir(parents=True, exist_ok=True)
  write_json(path / CONFIG, config)
  save_file(dict(tensors), str(path / WEIGHTS), metadata={"format": "pt"})
  if cfg.pooling != "cls":
    write_json(path / POOLING, pooling_config(cfg))
  if tokenizer is not None:
    tokenizer.save(path)
  return path


def pooling_config(cfg: EncoderConfig) -> dict[str, Any]:
  """sentence-transformers' 1_Pooling/config.json of cfg.pooling (cls, mean or max), in the
  pooling_mode_* spelling every version reads."""
  modes = {field: cfg.pooling == mode for mode, field in POOLING_MODES.items()}
  return {"word_embedding_dimension": cfg.emb_dim, **modes}


def tensors_from_params(cfg: EncoderConfig, params: Params
                        ) -> tuple[dict[str, np.ndarray], str | None]:
  """HF-named float32 arrays of our params (cfg.family), and the head's key, if any."""
  layout = layout_of(cfg)
  layout.hf_config(cfg)  # raises if the family cannot express cfg
  params = scan_to_loop(nn.meta.unbox(params))
  params = {k: v for k, v in params.items() if k not in layout.unsaved}
  head_keys = [h.key for h in layout.heads if h.key in params]
  if len(head_keys) > 1:
    raise ValueError(f"params hold heads {head_keys}; a {layout.architecture} directory holds one")
  head = layout.head(head_keys[0]) if head_keys else None
  encoder = encoder_params(params)
  slots = layout.encoder_slots(cfg, pooler="pooler" in encoder,
                               prefix=layout.prefix if head else "")
  head_slots = head.slots(cfg) if head else []
  pairs = [(s, encoder) for s in slots] + [(s, params.get(head.key)) for s in head_slots]
  wanted = {s.path for s in slots}
  if head:
    wanted = {(ENCODER,) + p for p in wanted} | {(head.key,) + s.path for s in head_slots}
  present = set(flatten(params))
  for label, paths in ((f"params with no {layout.family} name", present - wanted),
                       ("params missing", wanted - present)):
    if paths:
      raise ValueError(f"{label}: {sorted('/'.join(p) for p in paths)}")
  tensors = {s.hf_name: s.to_hf(np.asarray(get(tree, s.path), np.float32)) for s, tree in pairs}
  return tensors, head and head.key


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
    return read_safetensors(path / WEIGHTS)
  if (path / WEIGHTS_INDEX).is_file():
    shards = sorted(set(read_json(path / WEIGHTS_INDEX)["weight_map"].values()))
    return {k: v for shard in shards for k, v in read_safetensors(path / shard).items()}
  if (path / TORCH_WEIGHTS).is_file():
    return read_torch_weights(path / TORCH_WEIGHTS)
  raise FileNotFoundError(f"{path / WEIGHTS}: not found (nor {WEIGHTS_INDEX} or {TORCH_WEIGHTS})")


def read_safetensors(file: pathlib.Path) -> dict[str, np.ndarray]:
  """The tensors of one .safetensors file; ValueError naming it if it is truncated or
  damaged (e.g. an interrupted download)."""
  try:
    return load_file(str(file))
  except FileNotFoundError:
    raise
  except Exception as e:  # safetensors raises its own SafetensorError (and OSError)
    raise ValueError(f"{file}: truncated or damaged safetensors file ({e}); download or "
                     "convert it again") from None


def read_torch_weights(file: pathlib.Path) -> dict[str, np.ndarray]:
  """A torch state dict read with weights_only=True (no arbitrary unpickling)."""
  try:
    import torch  # lazy: optional extra parity (torch)
  except ImportError:
    raise ValueError(
        f"{file}: only a PyTorch pickle is here, and jaxencoder never unpickles. Convert it "
        "to safetensors first, e.g. with transformers installed: python -c \"import transformers "
        f"as t; t.AutoModel.from_pretrained('{file.parent}').save_pretrained('{file.parent}')\" "
        "(use BertForMaskedLM to keep an MLM head), or install torch to read it with "
        "torch.load(weights_only=True).") from None
  state = torch.load(str(file), map_location="cpu", weights_only=True)
  return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()}


def sentence_pooling(path: pathlib.Path, folder: str = str(POOLING.parent)) -> str | None:
  """'cls' / 'mean' / 'max' from sentence-transformers' pooling config (`folder`, as
  modules.json names it, /config.json), if present: its pooling_mode_* flags, or the
  single `pooling_mode` newer sentence-transformers versions write."""
  file = pathlib.Path(path) / folder / POOLING.name
  if not file.is_file():
    return None
  modes = read_json(file)
  if "pooling_mode" in modes:
    named = modes["pooling_mode"]
    named = [named] if isinstance(named, str) else list(named)
    chosen = [mode for mode in named if mode in POOLING_MODES]
    others = [mode for mode in named if mode not in POOLING_MODES]
  else:
    chosen = [mode for mode, field in POOLING_MODES.items() if modes.get(field)]
    others = [k for k, v in modes.items() if k.startswith("pooling_mode") and v
              and k not in POOLING_MODES.values()]
  if len(chosen) != 1 or others:
    raise ValueError(f"{file}: jaxencoder supports exactly one of {sorted(POOLING_MODES)} "
                     f"pooling, got {chosen + others}")
  return chosen[0]


def check_tokenizer(path, cfg: EncoderConfig, tokenizer: Tokenizer, where) -> None:
  """`tokenizer.check_fits` for the model of Hugging Face dir `path`: its table was
  learned with its own tokenizer, whose special ids its config.json names."""
  hf = read_json(pathlib.Path(path) / CONFIG)
  expected = {k: hf[k] for k in HF_SPECIAL_IDS if isinstance(hf.get(k), int)}
  check_fits(tokenizer, cfg, where, expected=expected, trained_table=True)


def read_tokenizer(path: pathlib.Path) -> Tokenizer | None:
  if any((path / name).is_file() for name in ("tokenizer.json", "vocab.txt", "vocab.json")):
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
