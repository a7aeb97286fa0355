"""Corpus statistics: example counts, token-length percentiles, padding efficiency."""

from __future__ import annotations

import numpy as np

from jaxencoder.data import kinds, pipeline, sources, token_ids
from jaxencoder.data.pipeline import Reading
from jaxencoder.data.readers import DataError, as_text

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
  """One epoch through the real pipeline: batches, rows, real tokens / all slots (the
  texts tokenised by `tokenizer`, whatever token ids the dataset stores)."""
  no_mask = pipeline.default_mask(tokenizer, rate=0.0)
  ds = pipeline.mlm_pipeline(source, tokenizer, seq_len=seq_len, batch_size=batch_size,
                             mode=mode, mask=no_mask,
                             sizes=pipeline.PackSizes(examples=pack_examples),
                             text=pipeline.TextInput(stored_ids=False),
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


# --- what a prepared dataset holds (`prepare`'s report) ----------------------------------
REPORT_PERCENTILES = (50, 90, 99, 100)
REPORT_SAMPLE = 100_000  # examples per split a report reads at most (evenly spread)
REPORT_LABELS = 8  # label counts shown per split; the rest summed


def report(path, kind: str, tokenizer=None) -> list[str]:
  """A few lines on the prepared dataset at `path`: per split its examples, label counts
  (labelled kinds) and text lengths (in `tokenizer`'s tokens, else words)."""
  if sources.ids_only(path):
    splits, features = list(token_ids.read_manifest(path)["splits"]), {}
  else:
    info = sources.open_builder(str(path)).info
    splits, features = list(info.splits), info.features
  label = kinds.kind_of(kind).label_feature
  names = _class_names(features[label]) if label in features else None
  lines = []
  for split in splits:
    source = sources.open_source(str(path), split)
    pick = _sample(len(source))
    parts = [f"{len(source):,} example{'s' * (len(source) != 1)}"]
    if names is not None:
      parts.append("labels: " + _label_counts(source, pick, label, names))
    if kinds.kind_of(kind).text:
      stored = _stored(source, tokenizer)
      lengths = _lengths(source, pick, tokenizer, stored)
      unit = "tokens" if tokenizer is not None else "words"
      pct = "/".join(str(int(np.percentile(lengths, p, method="inverted_cdf")))
                     for p in REPORT_PERCENTILES)  # lengths seen, not interpolated
      parts.append(f"{unit} p50/p90/p99/max: {pct if len(lengths) else '-'}")
    sampled = f" (read {len(pick):,}, evenly spread)" if len(pick) < len(source) else ""
    lines.append(f"{split}: {'; '.join(parts)}{sampled}")
  return lines


def _stored(source, tokenizer):
  """`source`'s stored ids when they are `tokenizer`'s (token_ids.stored), else None."""
  if tokenizer is None:
    return None
  try:
    return token_ids.stored(source, tokenizer)
  except DataError:  # another tokenizer's: count by tokenising
    return None


def _class_names(feature) -> list[str]:
  return list(getattr(feature, "feature", feature).names)


def _sample(n: int) -> np.ndarray:
  """[S] indices of the examples a report reads: all, or REPORT_SAMPLE evenly spread."""
  if n <= REPORT_SAMPLE:
    return np.arange(n)
  return np.unique(np.linspace(0, n - 1, REPORT_SAMPLE).astype(np.int64))


def _rows(source, pick: np.ndarray, chunk: int = 1024):
  """The examples `pick` of `source`, a chunk at a time."""
  for start in range(0, len(pick), chunk):
    yield from pipeline.read_examples(source, pick[start:start + chunk].tolist())


def _label_counts(source, pick, feature: str, names: list[str]) -> str:
  """`name count, ...` most frequent first (a tag sequence counts each tag)."""
  counts = np.zeros(len(names), np.int64)
  for row in _rows(source, pick):
    counts += np.bincount(np.atleast_1d(np.asarray(row[feature], np.int64)),
                          minlength=len(names))
  order = sorted(range(len(names)), key=lambda i: -counts[i])
  shown = [f"{names[i]} {counts[i]:,}" for i in order[:REPORT_LABELS] if counts[i]]
  rest = int(sum(counts[i] for i in order[REPORT_LABELS:]))
  return ", ".join(shown + ([f"{len(names) - REPORT_LABELS} more {rest:,}"] if rest else []))


def _lengths(source, pick, tokenizer, stored) -> np.ndarray:
  """[S] lengths of the examples `pick`: stored ids' counts, tokens (with [CLS]/[SEP])
  or whitespace-separated words; a pair (text, text_b) counts both."""
  if stored is not None:
    ids, records = stored
    _, start_S, end_S = ids.spans(pick if records is None else records(pick))
    return end_S - start_S
  lengths = []
  rows = list(_rows(source, pick))
  for start in range(0, len(rows), 1024):
    chunk = rows[start:start + 1024]
    if "words" in (chunk[0] if chunk else {}):
      a, b = [[as_text(w) for w in r["words"]] for r in chunk], None
    else:
      a = [as_text(r["text"]) for r in chunk]
      b = [as_text(r["text_b"]) for r in chunk] if "text_b" in chunk[0] else None
    lengths.append(_count(tokenizer, a, b))
  return np.concatenate(lengths) if lengths else np.zeros(0, np.int64)


def _count(tokenizer, a: list, b: list | None) -> np.ndarray:
  pretokenized = bool(a) and isinstance(a[0], list)
  if tokenizer is None:
    words = [len(x) if pretokenized else len(x.split()) for x in a]
    return np.asarray(words, np.int64) + (np.asarray([len(x.split()) for x in b]) if b else 0)
  if b is not None and not any(b):
    b = None
  batch = tokenizer.encode_batch(a, b, is_pretokenized=pretokenized)
  return batch["attention_mask"].sum(axis=1)
