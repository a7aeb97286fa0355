"""Random-access readers over prepared array_record datasets (ours or any tfds one).

A dataset may live on Cloud Storage (gs://...): array_record reads it there, record
by record, through its own Cloud Storage client; nothing is copied.
"""

from __future__ import annotations

import bisect
import difflib
import itertools

import tensorflow_datasets as tfds
from etils import epath
from tensorflow_datasets.core.data_sources.base import file_instructions

from jaxencoder.data import fetch, kinds, token_ids
from jaxencoder.data.readers import DataError, find_files
from jaxencoder.data.source_config import prepare_command
from jaxencoder.io.paths import as_path


def _versioned_dir(path: epath.Path) -> epath.Path | None:
  """`path` itself if it holds dataset_info.json, else its newest version subdir."""
  if (path / "dataset_info.json").exists():
    return path
  versions = sorted((p for p in path.glob("*") if (p / "dataset_info.json").exists()),
                    key=lambda p: tfds.core.Version(p.name) if _is_version(p.name) else p.name)
  return versions[-1] if versions else None


def _ids_only_dir(path: epath.Path) -> epath.Path | None:
  """`path` (or its newest version subdir) when it holds token ids and no records."""
  for candidate in [path] + sorted(path.glob("*"), key=lambda p: p.name, reverse=True):
    if ((candidate / token_ids.DIR / token_ids.MANIFEST).exists()
        and not (candidate / "dataset_info.json").exists()):
      return candidate
    if candidate is path and not path.is_dir():
      return None
  return None


def ids_only(path) -> bool:
  """Whether the dataset at `path` holds token ids and no records (--ids-only)."""
  return _ids_only_dir(as_path(path)) is not None


def _is_version(name: str) -> bool:
  try:
    tfds.core.Version(name)
    return True
  except ValueError:
    return False


def open_builder(name: str, data_dir=None):
  """A read-only builder for `name` = a directory, `kind/config` under data_dir, or a tfds name.

  A tfds catalogue name (e.g. "mnist") must already be prepared in array_record
  format under data_dir: nothing is downloaded here.
  """
  candidates = [as_path(name)]
  if data_dir is not None:
    candidates.append(as_path(data_dir) / name)
  for path in candidates:
    if path.is_dir() and (found := _versioned_dir(path)) is not None:
      return tfds.builder_from_directory(str(found))
  if as_path(name).exists():
    raise DataError(no_dataset_at(as_path(name)))
  if name.startswith(("/", ".", "~", "gs://")):
    raise DataError(f"{name}: {unknown_dataset(name, data_dir)}")
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception:  # tfds raises several types (and pages of text) for unknown names
    raise DataError(unknown_dataset(name, data_dir)) from None
  if not builder.is_prepared():
    raise DataError(f"tfds dataset {name!r} is not prepared under {builder.data_dir}; "
                    "prepare it in array_record format first (no downloads happen here)")
  return builder


def no_dataset_at(path: epath.Path) -> str:
  """One line: `path` holds no prepared dataset; what it holds, and how to prepare it."""
  files = find_files(path, lambda name: not name.startswith("."))
  suffixes = sorted({p.suffix.lower() for p in files})
  kind = next((k for s, k in _KIND_OF_SUFFIX if s in suffixes), "KIND")
  counts = {x or "suffix-less": sum(p.suffix.lower() == x for p in files) for x in suffixes}
  found = ", ".join(f"{n} {x} file{'s' * (n != 1)}" for x, n in list(counts.items())[:6])
  found = found or "nothing"
  return (f"no prepared dataset at {path}: looked for dataset_info.json or "
          f"{token_ids.DIR}/{token_ids.MANIFEST} (in it or a version folder), found "
          f"{found}; prepare it first: jaxencoder-data prepare {kind} --source {path} "
          f"--data-dir DATA_DIR --name NAME, then data.source={kind}/NAME")


_KIND_OF_SUFFIX = ((".csv", "text_classification"), (".tsv", "text_classification"),
                   (".conllu", "tagged_tokens"), (".ts", "time_series"), (".npz", "image_arrays"),
                   (".txt", "text_corpus"))


def unknown_dataset(name: str, data_dir=None) -> str:
  """One line: `name` is no directory, prepared dataset or fetch source; those that exist,
  the closest first."""
  fetchable = [s for s in fetch.SOURCES if s != "ucr"] + ["ucr/<NAME>"]
  ready = prepared(data_dir) if data_dir is not None else []
  names = {**{r.split("/", 1)[1]: r for r in ready}, **{r: r for r in fetchable + ready}}
  close = difflib.get_close_matches(name, list(names), n=1)
  hint = f" (did you mean {names[close[0]]!r}?)" if close else ""
  what = ("no such file or directory" if name.startswith(("/", ".", "~", "gs://"))
          else f"unknown data source {name!r}{hint}")
  where = f" under {data_dir} ({', '.join(ready) or 'none yet'})" if data_dir is not None else ""
  return (f"{what}: data.source takes a fetch source ({', '.join(fetchable)}), a dataset "
          f"prepared{where} as KIND/NAME, or a prepared dataset's directory")


def prepared(data_dir) -> list[str]:
  """`kind/name` of every dataset prepared under `data_dir` (a tfds data dir)."""
  root, found = as_path(data_dir), []
  for kind in kinds.names():
    if (root / kind).is_dir():
      found += [f"{kind}/{p.name}" for p in sorted((root / kind).iterdir())
                if _versioned_dir(p) is not None or _ids_only_dir(p) is not None]
  return found


def open_source(name: str, split: str = "train", data_dir=None):
  """Random-access source (len, [i], __getitems__) for one split; grain can read it. A
  text corpus prepared with --ids-only gives its token ids (token_ids.IdsOnly)."""
  for path in [as_path(name)] + ([as_path(data_dir) / name] if data_dir is not None else []):
    ids_only = _ids_only_dir(path)
    if ids_only is not None:
      return token_ids.IdsOnly(ids_only, split)
  builder = open_builder(name, data_dir)
  if split not in builder.info.splits:
    raise DataError(f"{name}: no split {split!r}; has {sorted(builder.info.splits)}")
  return with_named_shards(builder.as_data_source(split=split))


def with_named_shards(source):
  """A tfds data source whose shard files are checked: one missing is refused now, one
  that fails to read (truncated, damaged, deleted since) when it is read; both name the
  file and the command that rebuilds the dataset, not grain's page of traceback."""
  info = source.dataset_info
  shards = file_instructions(info, source.split)
  folder = epath.Path(str(info.data_dir))
  present = {p.name for p in folder.iterdir()}  # one listing, also on Cloud Storage
  missing = [s.filename for s in shards if epath.Path(s.filename).name not in present]
  if missing:
    more = f" (and {len(missing) - 1} more of its {len(shards)})" if len(missing) > 1 else ""
    raise DataError(f"{missing[0]}: missing{more}; rebuild the dataset: "
                    f"{prepare_command(folder)}")
  source.data_source = NamedShardReads(source.data_source, shards, folder)
  return source


class NamedShardReads:
  """array_record's reader of a split's shards (`data_source` of a tfds data source),
  whose read errors become a DataError naming the shard file and the command that
  rebuilds the dataset in `folder`."""

  def __init__(self, reader, shards, folder: epath.Path):
    self.reader, self.folder = reader, folder
    self.files = [s.filename for s in shards]
    self.ends = list(itertools.accumulate(s.take for s in shards))  # records before each end

  def __len__(self) -> int:
    return len(self.reader)

  def __getitem__(self, index):
    try:
      return self.reader[index]
    except (RuntimeError, OSError) as e:
      raise self.error(e, [index]) from None

  def __getitems__(self, indices):
    try:
      return self.reader.__getitems__(indices)
    except (RuntimeError, OSError) as e:
      raise self.error(e, indices) from None

  def error(self, error: Exception, indices) -> Exception:
    """The line for `error`: the shard of the first of `indices` that fails alone
    (`error` itself if each reads alone: a passing fault, e.g. of the network)."""
    for index in indices:
      try:
        self.reader[index]
      except (RuntimeError, OSError) as e:
        file = self.files[bisect.bisect_right(self.ends, int(index))]
        what = "missing" if "No such file" in str(e) else "truncated or damaged"
        first = (str(e).strip().splitlines() or [""])[0]  # the library's first line only
        detail = first.split(";")[0].split(" (")[0].strip()  # no checksums, no paths
        return DataError(f"{file}: {what} ({detail}); rebuild the dataset: "
                         f"{prepare_command(self.folder)}")
    return error


def split_names(name: str, data_dir=None) -> list[str]:
  """The splits of a prepared dataset (as `open_source` finds it), sorted."""
  for path in [as_path(name)] + ([as_path(data_dir) / name] if data_dir is not None else []):
    ids_only = _ids_only_dir(path)
    if ids_only is not None:
      return sorted(token_ids.read_manifest(ids_only)["splits"])
  return sorted(open_builder(name, data_dir).info.splits)


def label_names(name: str, data_dir=None, feature: str = "label") -> list[str]:
  """Class names of a ClassLabel feature (or of a Sequence of ClassLabel)."""
  feat = open_builder(name, data_dir).info.features[feature]
  return list(getattr(feat, "feature", feat).names)
