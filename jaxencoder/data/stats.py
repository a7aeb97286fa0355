"""Corpus statistics: example counts, token-length percentiles, padding efficiency."""

from __future__ import annotations

import numpy as np

from jaxencoder.data import pipeline
from jaxencoder.data.pipeline import Reading
from jaxencoder.data.readers import as_text

PERCENTILES = (50, 90, 95, 99, 100)


def token_lengths(source, tokenizer, text_key: str = "text", chunk: int = 2048) -> np.ndarray:
  """[N] untruncated token counts (with [CLS]/[SEP]), via the batched Rust encoder."""
  lengths = []
  for start in range(0, len(source), chunk):
    rows = source.__getitems__(list(range(start, min(start + chunk, len(source)))))
    texts = [as_text(r[text_key]) for r in rows]
    lengths.append(tokenizer.encode_batch(texts)["attention_mask"].sum(axis=1))
  return np.concatenate(lengths) if lengths else np.zeros(0, np.int64)


def batch_efficiency(source, tokenizer, *, seq_len: int, batch_size: int, mode: str,
                     pack_examples: int | None = None) -> dict:
  """One epoch through the real pipeline: batches, rows, real tokens / all slots."""
  no_mask = pipeline.default_mask(tokenizer, rate=0.0)
  ds = pipeline.mlm_pipeline(source, tokenizer, seq_len=seq_len, batch_size=batch_size,
                             mode=mode, mask=no_mask, pack_examples=pack_examples,
                             read=Reading(seed=0, num_epochs=1, shard_index=0, shard_count=1))
  real = slots = batches = 0
  for batch in ds:
    real += int(batch["attention_mask"].sum())
    slots += batch["attention_mask"].size
    batches += 1
  return {"mode": mode, "batches": batches, "real_tokens": real, "token_slots": slots,
          "efficiency": real / slots if slots else 0.0}


def corpus_stats(source, tokenizer, *, seq_len: int, batch_size: int,
                 pack_examples: int | None = None) -> dict:
  lengths = token_lengths(source, tokenizer)
  return {
      "examples": int(len(lengths)),
      "tokens": int(lengths.sum()),
      "length_percentiles": {f"p{p}": int(np.percentile(lengths, p)) for p in PERCENTILES},
      "truncated_examples": int((lengths > seq_len).sum()),
      "tokens_cut_by_truncation": int(np.maximum(lengths - seq_len, 0).sum()),
      "padded": batch_efficiency(source, tokenizer, seq_len=seq_len, batch_size=batch_size,
                                 mode="pad"),
      "packed": batch_efficiency(source, tokenizer, seq_len=seq_len, batch_size=batch_size,
                                 mode="pack", pack_examples=pack_examples),
  }


def format_stats(stats: dict, seq_len: int) -> str:
  pct = "  ".join(f"{k}={v}" for k, v in stats["length_percentiles"].items())
  lines = [f"examples: {stats['examples']}   tokens: {stats['tokens']}",
           f"token length percentiles: {pct}",
           f"longer than seq_len={seq_len}: {stats['truncated_examples']} examples, "
           f"{stats['tokens_cut_by_truncation']} tokens cut by truncation",
           f"{'mode':<8}{'batches':>9}{'real tokens':>13}{'slots':>11}{'efficiency':>12}"]
  for mode in ("padded", "packed"):
    s = stats[mode]
    lines.append(f"{mode:<8}{s['batches']:>9}{s['real_tokens']:>13}{s['token_slots']:>11}"
                 f"{s['efficiency']:>12.3f}")
  return "\n".join(lines)
