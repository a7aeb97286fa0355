"""Parsers for raw source files → plain-Python examples (no tfds, no grain).

Every bad input raises `DataError` naming the file and, where there is one,
the line. Nothing is skipped silently: there is no skip mode.

Split names come from file names: a stem ending in train / test / validation
(`GunPoint_TRAIN.ts`, `dev.tsv`, `t10k-images-idx3-ubyte.gz`) gives that
split, anything else is "train". Sources may be local or gs:// (read through epath).
"""

from __future__ import annotations

import csv
import fnmatch
import gzip
import re
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from etils import epath

from jaxencoder.io.paths import files_under

_SPLIT_ALIASES = {"train": "train", "test": "test", "t10k": "test", "dev": "validation",
                  "valid": "validation", "validation": "validation", "val": "validation"}


class DataError(ValueError):
  """A source file is empty, malformed, or holds a value outside its schema."""


def where(path, line: int | None = None) -> str:
  return f"{path}:{line}" if line is not None else f"{path}"


def split_of(path) -> str:
  """Split named by a file's stem (last `_`/`-`/`.`-separated word), else "train"."""
  stem = epath.Path(path).name.split(".")[0].lower()
  for word in reversed(re.split(r"[_\-.]", stem)):
    if word in _SPLIT_ALIASES:
      return _SPLIT_ALIASES[word]
  return "train"


def find_files(source, keep: Callable[[str], bool]) -> list[epath.Path]:
  """[source] if it is a file, else the files at any depth under it whose name passes
  `keep`, sorted (a local path stays as given: its files name the examples)."""
  source = epath.Path(source)
  if not source.exists():
    raise DataError(f"{source}: no such file or directory")
  if not source.is_dir():
    return [source]
  return [source / name for name in files_under(source) if keep(name.rsplit("/", 1)[-1])]


def matching(pattern: str) -> Callable[[str], bool]:
  """A `find_files` filter: file names matching a glob pattern (case-sensitive)."""
  return lambda name: fnmatch.fnmatchcase(name, pattern)


def files_by_split(source, suffixes: Sequence[str]) -> dict[str, list[epath.Path]]:
  """Groups files under `source` (a dir or a file) by split; errors if none match."""
  files = find_files(source, lambda name: name.lower().endswith(tuple(suffixes)))
  if not files:
    raise DataError(f"{source}: no files ending in {', '.join(suffixes)}")
  groups: dict[str, list[epath.Path]] = {}
  for f in files:
    groups.setdefault(split_of(f), []).append(f)
  return groups


def _read_text(path, encoding: str) -> str:
  text = epath.Path(path).read_bytes().decode(encoding)  # epath opens text as UTF-8 only
  if not text.strip():
    raise DataError(f"{where(path)}: file is empty")
  return text


# --- text corpus -----------------------------------------------------------------------
def read_documents(path, *, unit: str = "paragraph", encoding: str = "utf-8") -> Iterator[dict]:
  """Yields {"text", "origin"} per paragraph (blank-line separated), line or file."""
  lines = _read_text(path, encoding).splitlines()
  if unit == "file":
    yield {"text": "\n".join(lines).strip(), "origin": where(path, 1)}
    return
  if unit not in ("paragraph", "line"):
    raise ValueError(f"unit must be paragraph, line or file, got {unit!r}")
  block, start = [], None
  for no, line in enumerate(lines + [""], start=1):
    if line.strip():
      block.append(line.strip())
      start = no if start is None else start
    if block and (unit == "line" or not line.strip()):
      yield {"text": " ".join(block), "origin": where(path, start)}
      block, start = [], None


# --- text classification ---------------------------------------------------------------
def read_classification(path, labels: Sequence[str] | None = None) -> Iterator[dict]:
  """CSV / TSV rows `text,label` or `text,text_b,label` → {"text","text_b","label"}.

  A header row is recognised by its last column being literally "label".
  `label` is a string; it must be in `labels` when a label set is given.
  """
  delimiter = "\t" if str(path).lower().endswith(".tsv") else ","
  text = _read_text(path, "utf-8")
  rows = csv.reader(text.splitlines(), delimiter=delimiter)
  for no, row in enumerate(rows, start=1):
    if no == 1 and row and row[-1].strip().lower() == "label":
      continue
    if not row:
      continue  # blank line
    if len(row) not in (2, 3):
      raise DataError(f"{where(path, no)}: expected 2 or 3 columns (text[, text_b], label), "
                      f"got {len(row)}")
    label = row[-1].strip()
    if labels is not None and label not in labels:
      raise DataError(f"{where(path, no)}: label {label!r} not in label set {list(labels)}")
    if not row[0].strip():
      raise DataError(f"{where(path, no)}: empty text")
    yield {"text": row[0], "text_b": row[1] if len(row) == 3 else "", "label": label}


# --- tagged tokens ---------------------------------------------------------------------
def read_tagged(path, tags: Sequence[str] | None = None) -> Iterator[dict]:
  """`word/TAG word/TAG` lines or CoNLL-U (`.conllu`) → {"words", "tags"} per sentence."""
  parse = _conllu_sentences if str(path).lower().endswith(".conllu") else _slash_sentences
  for no, words, sent_tags in parse(path):
    if not words:
      raise DataError(f"{where(path, no)}: zero-length sentence")
    for tag in sent_tags:
      if tags is not None and tag not in tags:
        raise DataError(f"{where(path, no)}: tag {tag!r} not in tag set")
    yield {"words": words, "tags": sent_tags, "origin": where(path, no)}


def _slash_sentences(path):
  for no, line in enumerate(_read_text(path, "utf-8").splitlines(), start=1):
    if not line.strip():
      continue
    words, tags = [], []
    for item in line.split():
      word, sep, tag = item.rpartition("/")
      if not sep or not word or not tag:
        raise DataError(f"{where(path, no)}: malformed token {item!r}, expected word/TAG")
      words.append(word)
      tags.append(tag)
    yield no, words, tags


def _conllu_sentences(path):
  words, tags, start = [], [], None
  lines = _read_text(path, "utf-8").splitlines()
  for no, line in enumerate(lines + [""], start=1):
    if line.startswith("#"):
      continue
    if not line.strip():
      if start is not None:
        yield start, words, tags
      words, tags, start = [], [], None
      continue
    cols = line.split("\t")
    if len(cols) != 10:
      raise DataError(f"{where(path, no)}: CoNLL-U line has {len(cols)} columns, expected 10")
    if not cols[0].isdigit():
      continue  # multi-word token range (1-2) or empty node (1.1)
    start = no if start is None else start
    words.append(cols[1])
    tags.append(cols[3])  # UPOS


# --- images ----------------------------------------------------------------------------
def read_idx(path) -> np.ndarray:
  """An idx(.gz) file (MNIST format) → uint8 array; errors on a bad header or size."""
  raw = epath.Path(path).read_bytes()
  if str(path).endswith(".gz"):
    raw = gzip.decompress(raw)
  if not raw:
    raise DataError(f"{where(path)}: file is empty")
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
    raise DataError(f"{where(path)}: not an unsigned-byte idx file (bad magic)")
  ndim = raw[3]
  dims = np.frombuffer(raw[4:4 + 4 * ndim], ">u4").astype(int)
  data = np.frombuffer(raw[4 + 4 * ndim:], np.uint8)
  if len(dims) != ndim or data.size != int(np.prod(dims)):
    raise DataError(f"{where(path)}: header says shape {tuple(dims)}, file has {data.size} values")
  return data.reshape(dims)


def read_image_pairs(source) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{split: (images [N, H, W, C] uint8, labels [N] int)} from idx pairs or npz files.

  idx: `*images*` / `*labels*` files per split. npz: arrays `images`, `labels`
  (split from the file name) or `x_<split>`, `y_<split>`.
  """
  out = {}
  for split, files in files_by_split(source, (".npz", "ubyte", "ubyte.gz", ".idx")).items():
    for f in files:
      if f.suffix == ".npz":
        out.update(_npz_pairs(f, split))
    idx = [f for f in files if f.suffix != ".npz"]
    if idx:
      imgs = [f for f in idx if "images" in f.name]
      labs = [f for f in idx if "labels" in f.name]
      if len(imgs) != 1 or len(labs) != 1:
        raise DataError(f"{source}: split {split} needs one *images* and one *labels* idx file")
      out[split] = (read_idx(imgs[0]), read_idx(labs[0]))
  return {s: _check_pair(s, x, y, source) for s, (x, y) in out.items()}


def _npz_pairs(path, split):
  with epath.Path(path).open("rb") as f, np.load(f) as z:
    if "images" in z and "labels" in z:
      return {split: (z["images"], z["labels"])}
    pairs = {k[2:]: (z[k], z["y_" + k[2:]]) for k in z.files if k.startswith("x_")
             and "y_" + k[2:] in z}
  if not pairs:
    raise DataError(f"{where(path)}: needs arrays images+labels or x_<split>+y_<split>")
  return {_SPLIT_ALIASES.get(s, s): v for s, v in pairs.items()}


def _check_pair(split, images, labels, source):
  if images.ndim == 3:
    images = images[..., None]  # [N, H, W] → [N, H, W, 1]
  if images.ndim != 4 or labels.ndim != 1 or len(images) != len(labels):
    raise DataError(f"{source}: split {split}: images {images.shape} and labels {labels.shape} "
                    "do not pair up as [N, H, W(, C)] and [N]")
  if len(labels) == 0:
    raise DataError(f"{source}: split {split}: zero examples")
  return images.astype(np.uint8), labels.astype(np.int64)


# --- time series -----------------------------------------------------------------------
def read_ts(path) -> tuple[list[str] | None, list[dict]]:
  """A UCR/UEA `.ts` file → (class labels from the header, [{"series" [L, F], "label"}])."""
  labels, examples, in_data = None, [], False
  for no, line in enumerate(_read_text(path, "utf-8").splitlines(), start=1):
    line = line.strip()
    if not line or line.startswith("#"):
      continue
    if not in_data:
      low = line.lower()
      if low.startswith("@classlabel") and low.split()[1:2] == ["true"]:
        labels = line.split()[2:]
      in_data = low.startswith("@data")
      continue
    examples.append(_ts_example(path, no, line, labels))
  if not examples:
    raise DataError(f"{where(path)}: no series after @data")
  channels = {e["series"].shape[1] for e in examples}
  if len(channels) != 1:
    raise DataError(f"{where(path)}: series have differing channel counts {sorted(channels)}")
  return labels, examples


def _ts_example(path, no, line, labels):
  *channels, label = line.split(":")
  label = label.strip()
  if not channels:
    raise DataError(f"{where(path, no)}: malformed series line (no ':' before the label)")
  if labels is not None and label not in labels:
    raise DataError(f"{where(path, no)}: label {label!r} not in label set {labels}")
  if any(not c.strip() for c in channels):
    raise DataError(f"{where(path, no)}: zero-length series channel")
  try:
    values = [[float(v) if v.strip() != "?" else np.nan for v in c.split(",")] for c in channels]
  except ValueError as e:
    raise DataError(f"{where(path, no)}: malformed value ({e})") from None
  lengths = {len(v) for v in values}
  if len(lengths) != 1:
    raise DataError(f"{where(path, no)}: ragged channels of lengths {sorted(lengths)}")
  series_LxF = np.asarray(values, np.float32).T
  return {"series": series_LxF, "label": label, "origin": where(path, no)}
