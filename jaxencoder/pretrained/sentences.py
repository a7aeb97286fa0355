"""Sentence embeddings as sentence-transformers computes them: pooled, L2-normalised."""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Sequence

import jax
import numpy as np
import tqdm

from jaxencoder.config import EncoderConfig
from jaxencoder.encoder import Encoder
from jaxencoder.heads import l2_normalize
from jaxencoder.pretrained import hf_checkpoint

SMALLEST_BUCKET = 16


def embed(texts: Sequence[str], model_dir, *, batch_size: int = 32, max_length: int = 128,
          progress: bool = True) -> np.ndarray:
  """Unit-norm sentence embeddings [N, D] of `texts` with the BERT in `model_dir`.

  Pooling follows the directory's `1_Pooling/config.json` (mean without one; never
  BERT's dense pooler). Texts are sorted by length and run in fixed [batch_size, L]
  batches, L from a few power-of-two buckets up to `max_length`, so the jitted
  model compiles at most once per bucket.
  """
  cfg, params, tokenizer = _load_for_embedding(str(pathlib.Path(model_dir).resolve()))
  if max_length > cfg.max_positions:
    raise ValueError(f"max_length={max_length} exceeds the model's {cfg.max_positions} positions")
  order = np.argsort([-len(t) for t in texts], kind="stable")  # longest first
  embeddings_NxD = np.zeros((len(texts), cfg.emb_dim), np.float32)
  buckets = length_buckets(max_length)
  starts = range(0, len(texts), batch_size)
  for start in tqdm.tqdm(starts, desc="embed", unit="batch", disable=not progress):
    rows = order[start:start + batch_size]
    batch = tokenizer.encode_batch([texts[i] for i in rows], max_length=max_length)
    batch = pad_batch(batch, batch_size, bucket_for(batch["input_ids"].shape[1], buckets))
    pooled_BxD = _embed_batch(cfg, params, batch["input_ids"], batch["attention_mask"])
    embeddings_NxD[rows] = np.asarray(pooled_BxD)[:len(rows)]
  return embeddings_NxD


@functools.lru_cache(maxsize=4)
def _load_for_embedding(model_dir: str):
  """(cfg, params, tokenizer) with sentence pooling and no dense pooler; cached per dir."""
  pooling = hf_checkpoint.sentence_pooling(pathlib.Path(model_dir)) or "mean"
  cfg, params, tokenizer = hf_checkpoint.load(model_dir, pooling=pooling)
  if tokenizer is None:
    raise FileNotFoundError(f"{model_dir}: needs tokenizer.json or vocab.txt to embed text")
  return cfg, hf_checkpoint.encoder_params(params), tokenizer


@functools.partial(jax.jit, static_argnums=0)
def _embed_batch(cfg: EncoderConfig, params, input_ids_BxL, attention_mask_BxL) -> jax.Array:
  out = Encoder(cfg).apply({"params": params}, input_ids_BxL, attention_mask_BxL)
  return l2_normalize(out.pooled)


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
