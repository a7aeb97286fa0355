"""Sentence embeddings as sentence-transformers computes them, from the directory's files;
and those files written for a model (`write_sentence_transformers`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import pathlib
from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import save_file
from tokenizers import normalizers

from jaxencoder import progress as progress_lib
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.encoder import Encoder
from jaxencoder.model.heads import l2_normalize
from jaxencoder.pretrained import hf_checkpoint
from jaxencoder.pretrained.resolver import hf_dir
from jaxencoder.tokenizer import Tokenizer

SMALLEST_BUCKET = 16
MODULES = "modules.json"
SBERT_CONFIG = "sentence_bert_config.json"
ST_CONFIG = "config_sentence_transformers.json"  # the model's: similarity, prompts, version
MODULE_TYPE = "sentence_transformers.models.{}"  # the spelling every version reads
TANH = "torch.nn.modules.activation.Tanh"  # a Dense module's activation: BERT's pooler
PLAIN_MAX_LENGTH = 128  # a directory without modules.json: embed's length before it read them


@dataclasses.dataclass(frozen=True)
class SentenceConfig:
  """What sentence-transformers does with a directory (`sentence_transformers_config`).

  max_seq_length: tokens kept, specials included (None: the model's positions).
  transformer_path: the Transformer module's folder (weights, tokenizer), relative.
  dense_path: a Dense module's folder: BERT's pooler (dense + tanh on the pooled vector),
    the one Dense embed computes; None: the pooled vector as it is.
  similarity: config_sentence_transformers.json's similarity_fn_name (cosine, dot, ...).
  matryoshka_dims: the sizes a Matryoshka loss trained (its `matryoshka_dims` key, which
    sentence-transformers does not read: `SentenceTransformer(DIR, truncate_dim=N)` cuts).
  """
  max_seq_length: int | None = PLAIN_MAX_LENGTH
  do_lower_case: bool = False
  pooling: str = "mean"
  normalize: bool = True
  transformer_path: str = ""
  dense_path: str | None = None
  similarity: str = "cosine"
  matryoshka_dims: tuple[int, ...] = ()


def sentence_transformers_config(model_dir) -> SentenceConfig:
  """Reads modules.json, sentence_bert_config.json and the pooling config of `model_dir`.

  modules.json lists a Transformer, a Pooling and optionally BERT's pooler as a Dense
  module and a Normalize module (any other is a ValueError: embed cannot compute it).
  As in sentence-transformers, a missing sentence_bert_config.json or key means
  tokenizer_config.json's model_max_length (else the model's positions) and no
  lower-casing.
  Without modules.json (a plain Hugging Face directory) embed keeps its own defaults:
  1_Pooling if present else mean, L2-normalised, 128 tokens.
  """
  path = pathlib.Path(model_dir)
  if not (path / MODULES).is_file():
    return SentenceConfig(pooling=hf_checkpoint.sentence_pooling(path) or "mean")
  paths = {}
  for module in json.loads((path / MODULES).read_text(encoding="utf-8")):
    kind = module["type"].rsplit(".", 1)[-1]
    if kind not in ("Transformer", "Pooling", "Dense", "Normalize"):
      raise ValueError(f"{path / MODULES}: module {module['type']!r} is not supported; embed "
                       "computes Transformer, Pooling, Dense (BERT's pooler) and Normalize")
    paths[kind] = module.get("path", "")
  missing = [kind for kind in ("Transformer", "Pooling") if kind not in paths]
  if missing:
    raise ValueError(f"{path / MODULES}: lists no {' or '.join(missing)} module")
  root = path / paths["Transformer"]
  sbert = hf_checkpoint.read_json(root / SBERT_CONFIG) if (root / SBERT_CONFIG).is_file() else {}
  tokenizer_config = root / "tokenizer_config.json"
  max_length = sbert.get("max_seq_length") or (
      hf_checkpoint.read_json(tokenizer_config).get("model_max_length")
      if tokenizer_config.is_file() else None)
  pooling = hf_checkpoint.sentence_pooling(path, paths["Pooling"]) or "mean"
  model = hf_checkpoint.read_json(path / ST_CONFIG) if (path / ST_CONFIG).is_file() else {}
  return SentenceConfig(max_seq_length=max_length, do_lower_case=bool(sbert.get("do_lower_case")),
                        pooling=pooling, normalize="Normalize" in paths,
                        transformer_path=paths["Transformer"], dense_path=paths.get("Dense"),
                        similarity=model.get("similarity_fn_name") or "cosine",
                        matryoshka_dims=tuple(model.get("matryoshka_dims", ())))


def embed(texts: Sequence[str], model_dir, *, batch_size: int = 32,
          max_length: int | None = None, normalize: bool | None = None,
          progress: bool = True) -> np.ndarray:
  """Sentence embeddings [N, D] of `texts`, as sentence-transformers' `encode` gives them.

  `model_dir`: a sentence-transformers or Hugging Face directory, or a registered name
  ("minilm"). Follows `sentence_transformers_config(model_dir)`: pooling (never BERT's dense
  pooler), lower-casing, and by default its max_seq_length (capped at the model's
  positions; an explicit `max_length` past them is a ValueError) and whether a Normalize
  module L2-normalises. Texts are sorted by length and run in fixed [batch_size, L]
  batches, L from a few power-of-two buckets up to max_length, so the jitted model
  compiles at most once per bucket. `progress`: a bar (or plain lines) over the batches,
  on stderr.
  """
  model_dir = pathlib.Path(hf_dir(model_dir, "pretrained.embed")).resolve()
  cfg, params, tokenizer, sentence = _load_for_embedding(str(model_dir))
  if tokenizer is None:
    raise ValueError(f"{model_dir}: an {cfg.input_kind} encoder; embed reads text")
  return embed_with(texts, (cfg, params, tokenizer), sentence, batch_size=batch_size,
                    max_length=max_length, normalize=normalize, progress=progress)


def embed_with(texts: Sequence[str], model: tuple[EncoderConfig, dict, Tokenizer],
               sentence: SentenceConfig, *, batch_size: int = 32,
               max_length: int | None = None, normalize: bool | None = None,
               progress: bool = True) -> np.ndarray:
  """`embed` of a model already read: (cfg, Encoder params, tokenizer) and what
  sentence-transformers does with it (`sentence`)."""
  cfg, params, tokenizer = model
  if max_length is None:
    max_length = min(sentence.max_seq_length or cfg.max_positions, cfg.max_positions)
  elif max_length > cfg.max_positions:
    raise ValueError(f"max_length={max_length} exceeds the model's {cfg.max_positions} positions")
  normalize = sentence.normalize if normalize is None else normalize
  order = np.argsort([-len(t) for t in texts], kind="stable")  # longest first
  embeddings_NxD = np.zeros((len(texts), cfg.emb_dim), np.float32)
  buckets = length_buckets(max_length)
  starts = range(0, len(texts), batch_size)
  for start in progress_lib.track(starts, "embedding", unit="batch", enabled=progress):
    rows = order[start:start + batch_size]
    batch = tokenizer.encode_batch([texts[i] for i in rows], max_length=max_length)
    batch = pad_batch(batch, batch_size, bucket_for(batch["input_ids"].shape[1], buckets))
    pooled_BxD = _embed_batch(cfg, normalize, params, batch["input_ids"], batch["attention_mask"])
    embeddings_NxD[rows] = np.asarray(pooled_BxD)[:len(rows)]
  return embeddings_NxD


def sentence_model(model_dir):
  """(cfg, Encoder params, tokenizer, SentenceConfig) of a local directory, as
  sentence-transformers reads it: its pooling, no dense pooler, lower-casing when it says
  so; tokenizer None for an image encoder."""
  sentence = sentence_transformers_config(model_dir)
  root = pathlib.Path(model_dir) / sentence.transformer_path
  cfg, params, tokenizer = hf_checkpoint.load(root, pooling=sentence.pooling)
  if (pathlib.Path(model_dir) / MODULES).is_file():
    cfg, params = _pooler_as_listed(cfg, hf_checkpoint.encoder_params(params),
                                    pathlib.Path(model_dir), sentence.dense_path)
  if cfg.input_kind != "text":
    return cfg, hf_checkpoint.encoder_params(params), None, sentence
  if tokenizer is None:
    raise FileNotFoundError(f"{root}: needs tokenizer.json or vocab.txt to embed text")
  hf_checkpoint.check_tokenizer(root, cfg, tokenizer, f"{root}'s tokenizer")
  if sentence.do_lower_case:
    lowercase_first(tokenizer)
  return cfg, hf_checkpoint.encoder_params(params), tokenizer, sentence


# embed's: cached per directory
_load_for_embedding = functools.lru_cache(maxsize=4)(sentence_model)


def _pooler_as_listed(cfg: EncoderConfig, params: dict, model_dir: pathlib.Path,
                      dense_path: str | None) -> tuple[EncoderConfig, dict]:
  """BERT's pooler exactly when modules.json lists it as a Dense module (tanh, D -> D), its
  weights from there: sentence-transformers pools the token states, never the
  Transformer's own pooler output."""
  params = {k: v for k, v in params.items() if k != "pooler"}
  if dense_path is None:
    return cfg.replace(pooler_dense=False), params
  folder = model_dir / dense_path
  dense = hf_checkpoint.read_json(folder / "config.json")
  shape = (dense.get("in_features"), dense.get("out_features"))
  if dense.get("activation_function") != TANH or shape != (cfg.emb_dim,) * 2 or not dense.get(
      "bias", True):
    raise ValueError(f"{folder}: embed computes a Dense module only as BERT's pooler (tanh, "
                     f"{cfg.emb_dim} -> {cfg.emb_dim}, with bias); this one is {dense}")
  tensors = hf_checkpoint.read_tensors(folder)
  kernel = np.asarray(tensors["linear.weight"], np.float32).T  # torch's [out, in] -> [in, out]
  pooler = {"dense": {"kernel": kernel, "bias": np.asarray(tensors["linear.bias"], np.float32)}}
  dtype = jnp.dtype(cfg.param_dtype)
  return cfg.replace(pooler_dense=True), {**params, "pooler": jax.tree.map(
      lambda x: jnp.asarray(x, dtype), pooler)}


def write_sentence_transformers(path, cfg: EncoderConfig, params: dict,
                                sentence: SentenceConfig) -> None:
  """Adds to a Hugging Face directory (`hf_checkpoint.save`'s) what sentence-transformers
  needs to compute `sentence` with it: modules.json (Transformer at the root, Pooling,
  BERT's pooler as a Dense module when cfg has one, Normalize when sentence.normalize),
  sentence_bert_config.json, 1_Pooling/config.json and config_sentence_transformers.json.
  `sentence_transformers_config(path)` reads back `sentence` (with dense_path "2_Dense"
  where it wrote one)."""
  path = pathlib.Path(path)
  if cfg.pooling not in hf_checkpoint.POOLING_MODES or sentence.pooling != cfg.pooling:
    raise ValueError(f"pooling={cfg.pooling!r} has no sentence-transformers Pooling mode; "
                     f"a model that pools by {' / '.join(hf_checkpoint.POOLING_MODES)} has one")
  modules = [("Transformer", ""), ("Pooling", str(hf_checkpoint.POOLING.parent))]
  hf_checkpoint.write_json(path / hf_checkpoint.POOLING, hf_checkpoint.pooling_config(cfg))
  if cfg.pooler_dense:
    modules.append(("Dense", f"{len(modules)}_Dense"))
    _write_pooler(path / modules[-1][1], cfg, hf_checkpoint.encoder_params(params))
  if sentence.normalize:
    modules.append(("Normalize", f"{len(modules)}_Normalize"))
    hf_checkpoint.write_json(path / modules[-1][1] / "config.json", {})
  sbert = {"max_seq_length": sentence.max_seq_length, "do_lower_case": sentence.do_lower_case}
  layout = getattr(hf_checkpoint.family_module(cfg.family), "LAYOUT", None)
  if layout is not None and layout.pooler and "pooler" not in hf_checkpoint.encoder_params(params):
    sbert["model_args"] = {"add_pooling_layer": False}  # none saved: transformers would warn
  hf_checkpoint.write_json(path / SBERT_CONFIG, sbert)
  model = {"model_type": "SentenceTransformer", "similarity_fn_name": sentence.similarity,
           "prompts": {}, "default_prompt_name": None}
  if sentence.matryoshka_dims:
    model["matryoshka_dims"] = list(sentence.matryoshka_dims)
  hf_checkpoint.write_json(path / ST_CONFIG, model)
  (path / MODULES).write_text(json.dumps(
      [{"idx": i, "name": str(i), "path": folder, "type": MODULE_TYPE.format(kind)}
       for i, (kind, folder) in enumerate(modules)], indent=2) + "\n", encoding="utf-8")


def describe(sentence: SentenceConfig, cfg: EncoderConfig) -> str:
  """'mean pooling, 32 tokens, normalised, cosine' (what write_sentence_transformers wrote)."""
  parts = [f"{sentence.pooling} pooling" + (" + BERT's pooler" if cfg.pooler_dense else ""),
           f"{sentence.max_seq_length} tokens", "normalised" if sentence.normalize else "",
           sentence.similarity,
           f"Matryoshka {'/'.join(map(str, sentence.matryoshka_dims))}"
           if sentence.matryoshka_dims else ""]
  return ", ".join(p for p in parts if p)


def _write_pooler(folder: pathlib.Path, cfg: EncoderConfig, encoder: dict) -> None:
  """BERT's pooler (dense + tanh) as sentence-transformers' Dense module."""
  dense = nn.meta.unbox(encoder)["pooler"]["dense"]
  hf_checkpoint.write_json(folder / "config.json", {
      "in_features": cfg.emb_dim, "out_features": cfg.emb_dim, "bias": True,
      "activation_function": TANH})
  save_file({"linear.weight": np.ascontiguousarray(np.asarray(dense["kernel"], np.float32).T),
             "linear.bias": np.asarray(dense["bias"], np.float32)},
            str(folder / hf_checkpoint.WEIGHTS), metadata={"format": "pt"})


def lowercases(tokenizer: Tokenizer) -> bool:
  """Whether the tokenizer's normaliser lower-cases (a Lowercase or BertNormalizer step)."""
  normalizer = tokenizer.hf.normalizer
  steps = json.loads(normalizer.__getstate__()) if normalizer is not None else {}
  steps = steps.get("normalizers", [steps])  # a Sequence, or one normaliser
  return any(s.get("type") == "Lowercase" or (s.get("type") == "BertNormalizer"
                                               and s.get("lowercase")) for s in steps)


def lowercase_first(tokenizer: Tokenizer) -> None:
  """Lower-cases before the tokenizer's normaliser unless that already lower-cases (as
  sentence-transformers does for do_lower_case)."""
  if lowercases(tokenizer):
    return
  normalizer = tokenizer.hf.normalizer
  tokenizer.hf.normalizer = normalizers.Sequence(
      [normalizers.Lowercase()] + ([normalizer] if normalizer is not None else []))


@functools.partial(jax.jit, static_argnums=(0, 1))
def _embed_batch(cfg: EncoderConfig, normalize: bool, params, input_ids_BxL,
                 attention_mask_BxL) -> jax.Array:
  pooled_BxD = Encoder(cfg).apply({"params": params}, input_ids_BxL, attention_mask_BxL).pooled
  return l2_normalize(pooled_BxD) if normalize else pooled_BxD.astype(np.float32)


def length_buckets(max_length: int) -> tuple[int, ...]:
  """16, 32, 64, … below max_length, then max_length itself."""
  buckets = []
  length = SMALLEST_BUCKET
  while length < max_length:
    buckets.append(length)
    length *= 2
  return tuple(buckets) + (max_length,)


def bucket_for(length: int, buckets: Sequence[int]) -> int:
  return next(b for b in buckets if b >= length)


def pad_batch(batch: dict[str, np.ndarray], rows: int, length: int) -> dict[str, np.ndarray]:
  """Right-pads input_ids / attention_mask [b, l] with zeros to [rows, length]."""
  return {k: np.pad(batch[k], ((0, rows - batch[k].shape[0]), (0, length - batch[k].shape[1])))
          for k in ("input_ids", "attention_mask")}
