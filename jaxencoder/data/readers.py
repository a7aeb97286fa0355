"""Parsers for raw source files → plain-Python examples (no tfds, no grain).

Every bad input raises `DataError` naming the file and, where there is one,
the line (`path:line: what`), bytes that do not decode in the given encoding
included. Nothing is skipped silently: there is no skip mode. CSV / TSV files
name their columns in a header row (see `Columns`).

Split names come from file names: a stem ending in train / test / validation
(`GunPoint_TRAIN.ts`, `dev.tsv`, `t10k-images-idx3-ubyte.gz`) gives that
split, anything else is "train". Sources may be local or gs:// (read through epath).
"""

from __future__ import annotations

import codecs
import csv
import dataclasses
import decimal
import fnmatch
import gzip
import io
import json
import re
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from etils import epath

from jaxencoder.io.paths import files_under

_SPLIT_ALIASES = {"train": "train", "test": "test", "t10k": "test", "dev": "validation",
                  "valid": "validation", "validation": "validation", "val": "validation"}


class DataError(ValueError):
  """A source file is empty, malformed, or holds a value outside its schema."""


def as_text(value) -> str:
  """A record's text feature (bytes from array_record, or str) as str."""
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def check_not_empty(word_ids_BxL: np.ndarray, examples) -> None:
  """A DataError naming the first of `examples` whose encoding has no word token (only
  [CLS]/[SEP]); word_ids -1 on specials and padding."""
  empty = np.flatnonzero((np.asarray(word_ids_BxL) >= 0).sum(axis=1) == 0)
  if len(empty):
    origin = as_text(examples[int(empty[0])].get("origin", b"?"))
    raise DataError(f"{origin}: zero-length sequence (no tokens besides [CLS]/[SEP])")


def where(path, line: int | None = None) -> str:
  return f"{path}:{line}" if line is not None else f"{path}"


def check_spellings(labels_with_origins) -> None:
  """A DataError at the second spelling of one number among labels (`1`, then `1.0`,
  `01` or `+1`): the same class written two ways would become two classes.
  `labels_with_origins`: (label, "file:line") pairs."""
  check = spelling_check()
  for label, origin in labels_with_origins:
    check(label, origin)


def spelling_check() -> Callable[[str, str], None]:
  """`check_spellings` one label at a time: check(label, origin) remembers the first
  spelling of each number and raises at another."""
  first: dict[decimal.Decimal, tuple[str, str]] = {}

  def check(label: str, origin: str) -> None:
    try:
      value = decimal.Decimal(label.strip())
    except decimal.InvalidOperation:
      return  # not a number: a name, compared as written
    if not value.is_finite():
      return
    spelled, at = first.setdefault(value, (label, origin))
    if spelled != label:
      raise DataError(f"{origin}: label {label!r} spells the same number as label "
                      f"{spelled!r} ({at}); they would become two classes: write one spelling")
  return check


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


def read_text(path, encoding: str = "utf-8") -> str:
  """A whole file decoded with `encoding`; undecodable bytes or an empty file are errors."""
  raw = epath.Path(path).read_bytes()  # epath opens text as UTF-8 only
  try:
    text = raw.decode(encoding)
  except LookupError:
    raise DataError(f"{where(path)}: unknown encoding {encoding!r}") from None
  except UnicodeDecodeError as e:
    line = raw.count(b"\n", 0, e.start) + 1
    raise DataError(f"{where(path, line)}: byte {raw[e.start]:#04x} is not valid {encoding}; "
                    "pass the file's encoding, e.g. --encoding latin-1") from None
  if not text.strip():
    raise DataError(f"{where(path)}: file is empty")
  return text


# --- text corpus -----------------------------------------------------------------------
READ_BYTES = 1 << 20  # bytes per read of a text_corpus file
# characters per text_corpus example; longer documents are cut (the tokenizer needs about
# 190 bytes per character of a text while it encodes it: 50 MB for the longest)
MAX_DOCUMENT_CHARS = 1 << 18
_LINE_ENDS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # where str.splitlines splits
_LAST_SPACE = re.compile(r"\s\S*\Z")


def json_lines(path, fields: Sequence[str], *, prefix: str = ""
               ) -> Iterator[tuple[int, dict]]:
  """(line number, object) of each non-blank line of a JSON-lines file; a DataError naming
  `prefix` + path:line when a line is not a JSON object with string `fields` (the missing
  ones named)."""
  for no, line in enumerate(read_text(path).splitlines(), 1):
    if not line.strip():
      continue
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(f"{prefix}{where(path, no)}: not a JSON object ({e.msg})") from None
    missing = [f for f in fields if not isinstance(row, dict) or not isinstance(row.get(f), str)]
    if missing:
      raise DataError(f"{prefix}{where(path, no)}: needs string fields {', '.join(fields)}; "
                      f"missing {', '.join(missing)}")
    yield no, row


def read_documents(path, *, unit: str = "paragraph", encoding: str = "utf-8") -> Iterator[dict]:
  """Yields {"text", "origin"} per paragraph (blank-line separated), line or file.

  A paragraph joins its lines, each stripped, with a space; a line is stripped; a file
  keeps its line breaks (as "\\n") and is stripped. The file is read READ_BYTES at a time
  (`read_lines`), and a document longer than MAX_DOCUMENT_CHARS characters becomes
  several examples, cut at the last whitespace that fits (a longer word is cut too),
  origins `file:line part 1`, `part 2`, ... So reading holds at most about
  2 x (READ_BYTES + MAX_DOCUMENT_CHARS) characters (2.5 Mi: 2.5 MiB of ASCII) whatever the
  line length; shorter documents are what they always were.
  """
  if unit not in ("paragraph", "line", "file"):
    raise ValueError(f"unit must be paragraph, line or file, got {unit!r}")
  doc, lead, held = _Document(path), True, ""  # lead: no text yet on this line
  for no, text, ends in read_lines(path, encoding):
    if unit == "file":
      yield from doc.add(no, text + "\n" if ends else text)
    elif unit == "line":
      yield from doc.add(no, text)
      if ends:
        yield from doc.end()
    else:  # paragraph: `held` is whitespace that is inside the line if more text follows
      if lead and text.strip():
        text, held, lead = text.lstrip(), " " if doc.size else "", False
      body = text.rstrip()
      if not lead and body:
        yield from doc.add(no, held + body)
        held = text[len(body):]
      elif not lead:
        held = (held + text)[:MAX_DOCUMENT_CHARS + 1]  # a longer run is a cut anyway
      if ends:
        if lead:  # a blank line
          yield from doc.end()
        lead, held = True, ""
  yield from doc.end()


def cut_document(text: str, origin: str) -> list[dict]:
  """{"text", "origin"} examples of one document (stripped): itself, or if longer than
  MAX_DOCUMENT_CHARS, its parts as `read_documents` cuts them (`origin part k`)."""
  doc = _Document(origin)
  return doc.add(None, text) + doc.end()


class _Document:
  """One document's text, added a piece at a time; given out as examples of at most
  MAX_DOCUMENT_CHARS characters, each cut at the last whitespace that fits."""

  def __init__(self, path):
    self.path, self.parts, self.size, self.start, self.count = path, [], 0, None, 0

  def add(self, no: int, text: str) -> list[dict]:
    self.start = no if self.start is None else self.start
    self.parts.append(text)
    self.size += len(text)
    if self.size <= MAX_DOCUMENT_CHARS:
      return []
    out, rest = [], "".join(self.parts).lstrip()
    while len(rest) > MAX_DOCUMENT_CHARS and not rest[MAX_DOCUMENT_CHARS:].isspace():
      space = _LAST_SPACE.search(rest, 0, MAX_DOCUMENT_CHARS + 1)
      cut = space.start() if space else MAX_DOCUMENT_CHARS
      out += self._example(rest[:cut], last=False)
      rest = rest[cut:].lstrip()
    rest = rest[:MAX_DOCUMENT_CHARS + 1]  # only whitespace past the bound: more changes nothing
    self.parts, self.size = [rest], len(rest)
    return out

  def end(self) -> list[dict]:
    out = self._example("".join(self.parts), last=True)
    self.parts, self.size, self.start, self.count = [], 0, None, 0
    return out

  def _example(self, text: str, last: bool) -> list[dict]:
    text = text.strip()
    if not text:
      return []
    self.count += 1
    part = f" part {self.count}" if self.count > 1 or not last else ""
    return [{"text": text, "origin": where(self.path, self.start) + part}]


def read_lines(path, encoding: str = "utf-8") -> Iterator[tuple[int, str, bool]]:
  """(line number, text, whether the line ends there) of each line of a text file, read
  READ_BYTES at a time; a longer line comes in several pieces, the last one ending it.
  Lines split where str.splitlines splits, their ends dropped. Bytes that do not decode
  are an error naming their line (its number counted in b"\\n"), and so is an empty or
  all-whitespace file."""
  try:
    decoder = codecs.getincrementaldecoder(encoding)()
  except LookupError:
    raise DataError(f"{where(path)}: unknown encoding {encoding!r}") from None
  no, pending, newlines, blank, open_line = 1, "", 0, True, False
  with epath.Path(path).open("rb") as f:
    while True:
      raw = f.read(READ_BYTES)
      held = decoder.getstate()[0]  # undecoded bytes of the last read, decoded with these
      try:
        text = decoder.decode(raw, final=not raw)
      except UnicodeDecodeError as e:
        line = newlines - held.count(b"\n") + e.object.count(b"\n", 0, e.start) + 1
        raise DataError(f"{where(path, line)}: byte {e.object[e.start]:#04x} is not valid "
                        f"{encoding}; pass the file's encoding, e.g. --encoding latin-1") from None
      newlines += raw.count(b"\n")
      blank = blank and (not text or text.isspace())
      lines = (pending + text).splitlines(keepends=True) or ([""] if open_line and not raw else [])
      pending = lines.pop() if raw and lines and _unended(lines[-1]) else ""
      for line in lines:
        yield no, line.rstrip(_LINE_ENDS), True
        no, open_line = no + 1, False
      if not raw:
        break
      if len(pending) > READ_BYTES:  # a long line: give out what there is (a "\r" waits)
        keep = 1 if pending.endswith("\r") else 0
        yield no, pending[:len(pending) - keep], False
        pending, open_line = pending[len(pending) - keep:], True
  if blank:
    raise DataError(f"{where(path)}: file is empty")


def _unended(line: str) -> bool:
  """Whether a line from splitlines(keepends=True) may go on in the next read."""
  return not line.endswith(tuple(_LINE_ENDS)) or line.endswith("\r")


# --- text classification ---------------------------------------------------------------
CSV_FIELD_LIMIT = 16 * 2**20  # characters per field, so whole documents fit (csv: 128 KiB)


@dataclasses.dataclass(frozen=True)
class Columns:
  """Which CSV / TSV columns hold the text, the optional second text and the label.

  With a header row (the default) columns go by name: `text` (None: "text", or the
  one other column of a two-column header), `text_b` (None: "text_b" if present,
  else "") and `label`; a named column that is missing is an error. `header=False`:
  no header row; every row is `text,label` or `text,text_b,label`.
  """
  text: str | None = None
  text_b: str | None = None
  label: str = "label"
  header: bool = True


def read_classification(path, labels: Sequence[str] | None = None, *,
                        encoding: str = "utf-8", columns: Columns = Columns()) -> Iterator[dict]:
  """CSV / TSV rows → {"text", "text_b", "label", "origin"} (strings; text_b "" if absent).

  `label` is the string in the file (stripped), never a parsed number: `1` and `1.0` in
  one file are an error (`check_spellings`). It must be in `labels` when a label set is given.
  """
  delimiter = "\t" if str(path).lower().endswith(".tsv") else ","
  csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
  reader = csv.reader(io.StringIO(read_text(path, encoding), newline=""), delimiter=delimiter)
  pick, count, check = (None if columns.header else _positional), 0, spelling_check()
  for no, row in _csv_records(path, reader):
    if pick is None:
      pick = _by_header(path, no, row, columns)
      continue
    example = _classification_example(path, no, *pick(path, no, row), labels)
    check(example["label"], example["origin"])
    yield example
    count += 1
  if not count:
    raise DataError(f"{where(path)}: no rows{' below the header' if columns.header else ''}")


def _csv_records(path, reader) -> Iterator[tuple[int, list[str]]]:
  """(first line, fields) of each non-blank record; a csv error names its line."""
  end = 0
  while True:
    try:
      row = next(reader)
    except StopIteration:
      return
    except csv.Error as e:
      hint = "; is a quote left open?" if "field larger" in str(e) else ""
      raise DataError(f"{where(path, reader.line_num)}: {e}{hint}") from None
    start, end = end + 1, reader.line_num
    if row:
      yield start, row


def _positional(path, no, row):
  if len(row) not in (2, 3):
    raise DataError(f"{where(path, no)}: expected 2 or 3 columns (text[, text_b], label), "
                    f"got {len(row)}")
  return row[0], row[1] if len(row) == 3 else "", row[-1]


def _by_header(path, no, header, columns: Columns):
  """A row → (text, text_b, label) picker for this header; errors name what is missing."""
  names = [h.strip() for h in header]
  check_distinct(path, no, names)
  text = columns.text
  if text is None:
    others = [n for n in names if n != columns.label]
    text = "text" if "text" in names or len(others) != 1 else others[0]
  text_b = columns.text_b or ("text_b" if "text_b" in names else None)
  missing = [columns.label] if columns.label not in names else [
      n for n in (text, text_b) if n is not None and n not in names]
  if missing:
    raise DataError(
        f"{where(path, no)}: header {','.join(names)!r} has no column "
        f"{' or '.join(map(repr, missing))}; needs a text and a label column (text_b "
        "optional): name them text, label, text_b, or pick them with --label-column, "
        "--text-column, --text-b-column, or pass --no-header if the file has no header row")
  at = [names.index(n) if n is not None else None for n in (text, text_b, columns.label)]

  def pick(path, no, row):
    if len(row) != len(names):
      raise DataError(f"{where(path, no)}: {len(row)} fields, the header has {len(names)}")
    return tuple(row[i] if i is not None else "" for i in at)
  return pick


def check_distinct(path, no, names: Sequence[str]) -> None:
  """A DataError naming the first column a header names twice, and where: its first
  one would be read silently and the others dropped (unnamed columns are not checked)."""
  at: dict[str, list[int]] = {}
  for column, name in enumerate(names, 1):
    at.setdefault(name, []).append(column)
  twice = next(((name, columns) for name, columns in at.items() if name and len(columns) > 1),
               None)
  if twice is not None:
    name, columns = twice
    raise DataError(f"{where(path, no)}: header {','.join(names)!r} names column {name!r} "
                    f"{len(columns)} times (columns {', '.join(map(str, columns))}): give "
                    "each column its own name")


def _classification_example(path, no, text, text_b, label, labels) -> dict:
  label = label.strip()
  if not label:
    raise DataError(f"{where(path, no)}: missing label")
  if labels is not None and label not in labels:
    raise DataError(f"{where(path, no)}: label {label!r} not in label set {list(labels)}")
  if not text.strip():
    raise DataError(f"{where(path, no)}: empty text")
  return {"text": text, "text_b": text_b, "label": label, "origin": where(path, no)}


# --- text records ----------------------------------------------------------------------
def read_records(path, *, encoding: str = "utf-8") -> Iterator[dict]:
  """CSV / TSV rows with a header → {column: str, "origin": "file:line"}; every row must
  have the header's number of fields."""
  delimiter = "\t" if str(path).lower().endswith(".tsv") else ","
  csv.field_size_limit(max(csv.field_size_limit(), CSV_FIELD_LIMIT))
  reader = csv.reader(io.StringIO(read_text(path, encoding), newline=""), delimiter=delimiter)
  names, count = None, 0
  for no, row in _csv_records(path, reader):
    if names is None:
      names = [h.strip() for h in row]
      check_distinct(path, no, names)
      if "origin" in names or not all(names):
        raise DataError(f"{where(path, no)}: header {','.join(names)!r} needs distinct, "
                        "non-empty column names other than 'origin'")
      continue
    if len(row) != len(names):
      raise DataError(f"{where(path, no)}: {len(row)} fields, the header has {len(names)}")
    yield {**dict(zip(names, row)), "origin": where(path, no)}
    count += 1
  if not count:
    raise DataError(f"{where(path)}: no rows below the header")


# --- tagged tokens ---------------------------------------------------------------------
def read_tagged(path, tags: Sequence[str] | None = None, *,
                encoding: str = "utf-8") -> Iterator[dict]:
  """`word/TAG word/TAG` lines or CoNLL-U (`.conllu`) → {"words", "tags"} per sentence."""
  parse = _conllu_sentences if str(path).lower().endswith(".conllu") else _slash_sentences
  for no, words, sent_tags in parse(path, encoding):
    if not words:
      raise DataError(f"{where(path, no)}: zero-length sentence")
    for tag in sent_tags:
      if tags is not None and tag not in tags:
        raise DataError(f"{where(path, no)}: tag {tag!r} not in tag set")
    yield {"words": words, "tags": sent_tags, "origin": where(path, no)}


def _slash_sentences(path, encoding):
  for no, line in enumerate(read_text(path, encoding).splitlines(), start=1):
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


def _conllu_sentences(path, encoding):
  words, tags, start = [], [], None
  lines = read_text(path, encoding).splitlines()
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
IMAGE_SUFFIXES = (".npz", "ubyte", "ubyte.gz", ".idx")


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
  """{split: (images [N, H, W, C] uint8, labels [N] int64)} from idx pairs or npz files.

  idx: `*images*` / `*labels*` files per split. npz: arrays `images`, `labels`
  (split from the file name) or `x_<split>`, `y_<split>`. Pixels keep their values
  (`pixel_bytes`: uint8 as is, float in [0, 1] scaled by 255, 16-bit scaled by 1/257);
  labels are exact integers (`integer_labels`). Anything else is a DataError naming the
  file, the split and the values found; nothing wraps or truncates.
  """
  out = {}
  for split, files in files_by_split(source, IMAGE_SUFFIXES).items():
    for f in files:
      if f.suffix == ".npz":
        out.update({s: (x, y, f) for s, (x, y) in _npz_pairs(f, split).items()})
    idx = [f for f in files if f.suffix != ".npz"]
    if idx:
      imgs = [f for f in idx if "images" in f.name]
      labs = [f for f in idx if "labels" in f.name]
      if len(imgs) != 1 or len(labs) != 1:
        raise DataError(f"{source}: split {split} needs one *images* and one *labels* idx file")
      out[split] = (read_idx(imgs[0]), read_idx(labs[0]), imgs[0])
  return {s: _check_pair(s, x, y, f) for s, (x, y, f) in out.items()}


def _npz_pairs(path, split):
  with epath.Path(path).open("rb") as f, np.load(f) as z:
    if "images" in z and "labels" in z:
      return {split: (z["images"], z["labels"])}
    pairs = {k[2:]: (z[k], z["y_" + k[2:]]) for k in z.files if k.startswith("x_")
             and "y_" + k[2:] in z}
  if not pairs:
    raise DataError(f"{where(path)}: needs arrays images+labels or x_<split>+y_<split>")
  return {_SPLIT_ALIASES.get(s, s): v for s, v in pairs.items()}


def _check_pair(split, images, labels, path):
  if images.ndim == 3:
    images = images[..., None]  # [N, H, W] → [N, H, W, 1]
  if images.ndim != 4 or labels.ndim != 1 or len(images) != len(labels):
    raise DataError(f"{path}: split {split}: images {images.shape} and labels {labels.shape} "
                    "do not pair up as [N, H, W(, C)] and [N]")
  if len(labels) == 0:
    raise DataError(f"{path}: split {split}: zero examples")
  at = f"{path}: split {split}"
  return pixel_bytes(images, at), integer_labels(labels, at)


PIXEL_RULE = ("uint8 as is; float in [0, 1] x 255, rounded; float or integers in [0, 255] "
              "(max > 1) as is, rounded; uint16 with values above 255 / 257, rounded")


def pixel_bytes(images: np.ndarray, at: str) -> np.ndarray:
  """Images as uint8 0..255 by PIXEL_RULE; a DataError at `at` (file: split) otherwise.

  uint16 whose values all fit 0..255 is refused: 8-bit pixels in a 16-bit array and a
  near-black 16-bit image look the same, so the caller must say which (cast or scale).
  """
  if images.dtype == np.uint8:
    return images
  kind = images.dtype.kind
  if kind not in "iuf":
    raise DataError(f"{at}: images of dtype {images.dtype} are not pixel values; "
                    f"store numbers ({PIXEL_RULE})")
  values = images.astype(np.float64)
  if np.isnan(values).any():
    raise DataError(f"{at}: images hold NaN; pixels must be numbers ({PIXEL_RULE})")
  low, high = float(values.min()), float(values.max())
  found = f"values {low:g}..{high:g} ({images.dtype})"
  if images.dtype == np.uint16:
    if high <= 255:
      raise DataError(f"{at}: uint16 images with {found}: 8-bit pixels or a dark 16-bit "
                      "image? Cast them to uint8 (0..255 pixels) or to float in [0, 1]")
    values = values / 257.0
  elif kind == "f" and high <= 1:
    values = values * 255.0
  if low < 0 or values.max() > 255:
    raise DataError(f"{at}: images with {found} do not map to 0..255 pixels by the rule: "
                    f"{PIXEL_RULE}")
  return np.round(values).astype(np.uint8)


def integer_labels(labels: np.ndarray, at: str) -> np.ndarray:
  """Class labels as int64: integers as they are, floats only when integral (2.0 -> 2);
  2.7, NaN or text are a DataError at `at` naming the first such value."""
  if labels.dtype.kind in "biu":
    return labels.astype(np.int64)
  if labels.dtype.kind != "f":
    raise DataError(f"{at}: labels of dtype {labels.dtype} are not class numbers; store "
                    "integers 0..C-1")
  bad = np.flatnonzero(~np.isfinite(labels) | (labels != np.round(labels)))
  if len(bad):
    i = int(bad[0])
    raise DataError(f"{at}: label {float(labels[i]):g} at index {i} is not an integer "
                    f"({len(bad)} such); class labels are integers 0..C-1")
  return labels.astype(np.int64)


# --- time series -----------------------------------------------------------------------
def read_ts(path, encoding: str = "utf-8") -> tuple[list[str] | None, list[dict]]:
  """A UCR/UEA `.ts` file → (class labels from the header, [{"series" [L, F], "label"}])."""
  labels, examples, in_data = None, [], False
  for no, line in enumerate(read_text(path, encoding).splitlines(), start=1):
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
