"""The austen source: its writer and text_corpus preparation on tiny books, and (slow)
the real fetch from Debian's r-cran-janeaustenr."""

import shutil
import struct
import zlib

import numpy as np
import pytest

from jaxencoder.data import builders, fetch, sources

BOOKS = {
    "emma": ["EMMA", "", "By Jane Austen", "", "", "CHAPTER I", "",
             "Emma Woodhouse, handsome, clever,", "  and rich.", "", "She was the youngest."],
    "persuasion": ["Sir Walter Elliot,", "of Kellynch Hall, in Somersetshire, was a man",
                   "", "Vanity was the beginning £ and the end."],
}


def test_austen_books_prepare_as_a_text_corpus_of_paragraphs(tmp_path):
  fetch.write_austen(BOOKS, tmp_path / "raw")
  assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == ["emma.txt", "persuasion.txt"]
  assert (tmp_path / "raw" / "emma.txt").read_text(encoding="utf-8").split("\n")[:3] == [
      "EMMA", "", "By Jane Austen"]
  kind, options = builders.FETCHED["austen"]
  path = builders.prepare(kind, tmp_path / "raw", tmp_path / "tfds", name="austen", **options)
  train = sources.open_source(str(path), "train")
  texts = sorted(train[i]["text"].decode() for i in range(len(train)))
  assert texts == sorted([
      "EMMA", "By Jane Austen", "CHAPTER I", "Emma Woodhouse, handsome, clever, and rich.",
      "She was the youngest.",
      "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man",
      "Vanity was the beginning £ and the end."])


def test_read_lazyload_reads_a_zlib_db_as_janeaustenr_ships_it(tmp_path):
  import rdata
  rds = tmp_path / "emma.rds"
  rdata.write_rds(rds, np.array(BOOKS["emma"]), compression=None)
  raw = rds.read_bytes()
  chunk = struct.pack(">i", len(raw)) + zlib.compress(raw)  # compress = TRUE: no type byte
  (tmp_path / "Rdata.rdb").write_bytes(chunk)
  index = {"variables": {"emma": np.array([0, len(chunk)], np.int32)},
           "compressed": np.array([True])}
  rdata.write_rds(tmp_path / "Rdata.rdx", index, compression="gzip")
  emma = fetch.read_lazyload(tmp_path / "Rdata", ["emma"])["emma"]
  assert [str(line) for line in emma] == BOOKS["emma"]


@pytest.mark.slow
def test_austen_fetches_six_novels_of_about_700k_words(tmp_path):
  if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
    pytest.skip("apt-get / dpkg-deb unavailable: austen is fetched as a Debian package")
  out = fetch.fetch("austen", tmp_path)
  files = sorted(out.glob("*.txt"))
  assert [f.stem for f in files] == sorted(fetch.AUSTEN_BOOKS)
  words = sum(len(f.read_text(encoding="utf-8").split()) for f in files)
  assert 650_000 < words < 750_000, words
