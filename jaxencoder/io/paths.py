"""Paths a user passes: local files or Cloud Storage URLs (`gs://bucket/...`).

Everything that takes a path from a user (workdir, data_dir, init_from, tokenizer,
probe and convert paths) goes through `as_path`, which returns an `etils.epath.Path`:
local paths become absolute (orbax needs that), URLs stay URLs. Never
`pathlib.Path(url)`: it turns `gs://b/run` into a local directory `gs:/b/run`.

Who reads gs:// how (none needs TensorFlow): epath through fsspec/gcsfs; orbax's
arrays through tensorstore; array_record (prepared datasets) through its bundled
Cloud Storage client. What needs local files stages them: tfds builds a dataset
locally and `copy_tree` uploads it; MetricWriter appends locally and uploads; the
WordPiece trainer reads a `local_copy`.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

from etils import epath

URL_SCHEMES = ("gs://", "s3://", "az://", "hf://")
_CHUNK = 16 * 2**20  # bytes per read when copying


def is_url(path: os.PathLike | str) -> bool:
  """Whether `path` names an object store (gs://, s3://, ...) rather than local disk."""
  return str(path).startswith(URL_SCHEMES)


def as_path(path: os.PathLike | str) -> epath.Path:
  """An epath.Path: absolute for local paths, unchanged for URLs."""
  if isinstance(path, epath.Path) and is_url(path):
    return path
  text = os.fspath(path)
  if is_url(text):
    return epath.Path(text)
  return epath.Path(os.path.abspath(os.path.expanduser(text)))


def make_dirs(path: os.PathLike | str) -> None:
  """`mkdir -p` for a local path; nothing for a URL: object stores have no folders, and
  gcsfs's mkdir looks the bucket up (a permission of its own), even creates it."""
  if not is_url(path):
    as_path(path).mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def removed_if_left_empty(path: os.PathLike | str, *, enabled: bool = True) -> Iterator[None]:
  """Should the block fail, removes the folders of local `path` that did not exist before
  it (`path` and missing parents) and that it left empty: a refused command leaves no
  empty folder behind. URLs: nothing (object stores have no folders)."""
  made = []
  if enabled and not is_url(path):
    local = pathlib.Path(as_path(path))
    made = [folder for folder in (local, *local.parents) if not folder.exists()]
  try:
    yield
  except BaseException:
    for folder in made:  # innermost first; one that holds something stays, with its parents
      if not folder.exists():  # removed inside the block
        continue
      try:
        folder.rmdir()
      except OSError:
        break
    raise


def copy_file(src: os.PathLike | str, dst: os.PathLike | str) -> None:
  """Streams one file between any two places (local or URL); overwrites `dst`."""
  src, dst = as_path(src), as_path(dst)
  make_dirs(dst.parent)
  with src.open("rb") as reader, dst.open("wb") as writer:
    shutil.copyfileobj(reader, writer, _CHUNK)


def files_under(root: os.PathLike | str) -> list[str]:
  """Relative names ("a/b.txt") of every file under `root`, sorted.

  By listing folder by folder: epath's rglob / walk do not do gs://.
  """
  root = as_path(root)
  names = []
  for child in root.iterdir():
    if child.is_dir():
      names += [f"{child.name}/{name}" for name in files_under(child)]
    else:
      names.append(child.name)
  return sorted(names)


def copy_tree(src: os.PathLike | str, dst: os.PathLike | str, *,
              last: str | None = None) -> epath.Path:
  """Copies every file under `src` to the same name under `dst`; returns `dst`.

  `last` names a file copied after all others: a completion marker (e.g.
  dataset_info.json), so a reader never sees it beside missing files.
  """
  src, dst = as_path(src), as_path(dst)
  names = files_under(src)
  for name in sorted(names, key=lambda n: n == last):
    copy_file(src / name, dst / name)
  return dst


@contextlib.contextmanager
def local_copy(path: os.PathLike | str) -> Iterator[pathlib.Path]:
  """`path` itself when local; for a URL, a temporary local copy (file or tree)."""
  path = as_path(path)
  if not is_url(path):
    yield pathlib.Path(path)
    return
  if not path.exists():
    raise FileNotFoundError(f"{path}: no such file or directory")
  with tempfile.TemporaryDirectory(prefix="jaxencoder-") as tmp:
    local = pathlib.Path(tmp) / path.name
    if path.is_dir():
      copy_tree(path, local)
    else:
      copy_file(path, local)
    yield local
