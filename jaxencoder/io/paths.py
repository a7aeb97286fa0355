"""Paths a user passes: local files or Cloud Storage URLs (`gs://bucket/...`).

Everything that takes a path from a user (workdir, data_dir, init_from, tokenizer,
probe and convert paths) goes through `as_path`, which returns an `etils.epath.Path`:
local paths become absolute (orbax needs that), URLs stay URLs. Never
`pathlib.Path(url)`: it turns `gs://b/run` into a local directory `gs:/b/run`.
"""

from __future__ import annotations

import os

from etils import epath

URL_SCHEMES = ("gs://", "s3://", "az://", "hf://")


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
