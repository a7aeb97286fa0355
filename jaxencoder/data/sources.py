"""Random-access readers over prepared array_record datasets (ours or any tfds one).

A dataset may live on Cloud Storage (gs://...): array_record reads it there, record
by record, through its own Cloud Storage client; nothing is copied.
"""

from __future__ import annotations

import tensorflow_datasets as tfds
from etils import epath

from jaxencoder.data import token_ids
from jaxencoder.data.readers import DataError
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
  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except Exception as e:  # tfds raises several types for unknown names/configs
    raise DataError(f"dataset {name!r} not found under data_dir={data_dir}: prepare it with "
                    f"`python -m jaxencoder.data prepare ...` ({type(e).__name__}: {e})") from None
  if not builder.is_prepared():
    raise DataError(f"tfds dataset {name!r} is not prepared under {builder.data_dir}; "
                    "prepare it in array_record format first (no downloads happen here)")
  return builder


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
  return builder.as_data_source(split=split)


def label_names(name: str, data_dir=None, feature: str = "label") -> list[str]:
  """Class names of a ClassLabel feature (or of a Sequence of ClassLabel)."""
  feat = open_builder(name, data_dir).info.features[feature]
  return list(getattr(feat, "feature", feat).names)
