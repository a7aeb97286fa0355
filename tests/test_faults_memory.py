"""Issue 30, item 4: memory bounded by the batch, not the line.

A text_corpus file is read READ_BYTES at a time and a document longer than
MAX_DOCUMENT_CHARS becomes several examples (cut at whitespace); training tokenises a
prefix of each text. Both bounds are module constants, made small here.
"""

import json
import subprocess
import sys

import numpy as np
import pytest

from data_helpers import WORDS, tiny_tokenizer
from jaxencoder.data import readers, token_ids
from jaxencoder.data.readers import DataError, where


def old_read_documents(path, unit="paragraph", encoding="utf-8"):
  """read_documents before chunking (whole file, splitlines): the reference."""
  lines = readers.read_text(path, encoding).splitlines()
  if unit == "file":
    yield {"text": "\n".join(lines).strip(), "origin": where(path, 1)}
    return
  block, start = [], None
  for no, line in enumerate(lines + [""], start=1):
    if line.strip():
      block.append(line.strip())
      start = no if start is None else start
    if block and (unit == "line" or not line.strip()):
      yield {"text": " ".join(block), "origin": where(path, start)}
      block, start = [], None


NORMAL = ["one line", "a b\nc d\n\n\ne f\n", "  lead\ttab  \r\n\r\nx\ry\n",
          "é ü 中\n\nüber alles", "\n\n para\n graph \n\n\n",
          "form\x0cfeed\u2028sep\x85next\n", "last line no newline"]


@pytest.mark.parametrize("read_bytes", [1, 3, 16, 1 << 20])
@pytest.mark.parametrize("unit", ["paragraph", "line", "file"])
def test_normal_files_give_the_examples_they_always_gave(tmp_path, monkeypatch, read_bytes, unit):
  monkeypatch.setattr(readers, "READ_BYTES", read_bytes)
  for i, text in enumerate(NORMAL):
    path = tmp_path / f"{i}.txt"
    path.write_bytes(text.encode())
    assert list(readers.read_documents(path, unit=unit)) == list(old_read_documents(path, unit))


def long_line(words: int, seed: int = 0) -> str:
  return " ".join(np.random.default_rng(seed).choice(WORDS, words))


@pytest.mark.parametrize("unit", ["paragraph", "line", "file"])
def test_a_line_longer_than_the_bounds_gives_bounded_examples_of_all_its_words(
    tmp_path, monkeypatch, unit):
  monkeypatch.setattr(readers, "READ_BYTES", 64)
  monkeypatch.setattr(readers, "MAX_DOCUMENT_CHARS", 100)
  text = long_line(2000)
  path = tmp_path / "one.txt"
  path.write_text(text)  # no newline at all
  examples = list(readers.read_documents(path, unit=unit))
  assert len(examples) > len(text) // 100
  assert max(len(e["text"]) for e in examples) <= 100
  assert " ".join(e["text"] for e in examples).split() == text.split()  # no word cut or lost
  assert [e["origin"] for e in examples] == [f"{path}:1 part {k}"
                                             for k in range(1, len(examples) + 1)]


def test_a_word_longer_than_the_bound_is_cut_and_kept(tmp_path, monkeypatch):
  monkeypatch.setattr(readers, "MAX_DOCUMENT_CHARS", 10)
  path = tmp_path / "word.txt"
  path.write_text("ab " + "x" * 25 + " cd\n\nnext")
  texts = [e["text"] for e in readers.read_documents(path)]
  assert texts == ["ab", "x" * 10, "x" * 10, "xxxxx cd", "next"]


def test_a_multibyte_character_across_reads_decodes(tmp_path, monkeypatch):
  text = "aé中🙂 b" * 50
  path = tmp_path / "utf8.txt"
  path.write_text(text, encoding="utf-8")
  for read_bytes in (1, 2, 3, 5):
    monkeypatch.setattr(readers, "READ_BYTES", read_bytes)
    assert [e["text"] for e in readers.read_documents(path)] == [text.strip()]


def test_a_bad_byte_after_the_first_read_names_its_line(tmp_path, monkeypatch):
  monkeypatch.setattr(readers, "READ_BYTES", 8)
  path = tmp_path / "bad.txt"
  path.write_bytes(b"first line\nsecond line\n\nfourth \xc3 line\n")  # \xc3 then a space
  with pytest.raises(DataError) as error:
    list(readers.read_documents(path))
  assert str(error.value) == (f"{path}:4: byte 0xc3 is not valid utf-8; pass the file's "
                              "encoding, e.g. --encoding latin-1")
  path.write_bytes(b"ok\n" * 5 + b"cut \xe4\xb8")  # a character cut off by the end of the file
  with pytest.raises(DataError, match=rf"^{path}:6: byte 0xe4 is not valid utf-8"):
    list(readers.read_documents(path))


def test_an_all_whitespace_file_is_still_empty(tmp_path, monkeypatch):
  monkeypatch.setattr(readers, "READ_BYTES", 2)
  path = tmp_path / "blank.txt"
  path.write_text(" \n\n\t \n")
  with pytest.raises(DataError, match=rf"^{path}: file is empty$"):
    list(readers.read_documents(path))


def test_training_rows_from_a_prefix_equal_the_whole_texts_rows(monkeypatch):
  """encode_rows tokenises a prefix (grown while it does not fill seq_len): the rows are
  the whole text's, and the tokenizer never sees the whole of a long text."""
  tok = tiny_tokenizer()
  rng = np.random.default_rng(0)
  pieces = list(WORDS) + ["  ", "\n", ".", "x" * 150, "\x00"]
  texts = ["".join(rng.choice(pieces) + " " * rng.integers(0, 2)
                   for _ in range(rng.integers(1, 60))) for _ in range(100)]
  texts += ["the " + "\x00 " * 300 + "cat", long_line(50_000)]
  texts = [t.strip() for t in texts if len(tok.encode(t)["input_ids"]) > 2]
  seen = []
  encode = tok.encode_batch
  monkeypatch.setattr(tok, "encode_batch",
                      lambda t, **kw: seen.extend(map(len, t)) or encode(t, **kw))
  monkeypatch.setattr(token_ids, "PREFIX_CHARS", 1)
  got = token_ids.encode_rows([{"text": t} for t in texts], tok, 8)
  monkeypatch.setattr(tok, "encode_batch", encode)
  want = tok.encode_batch(texts, max_length=8, pad_to=8)
  for g, w in zip(got, (want["input_ids"], want["word_ids"], want["attention_mask"].sum(1))):
    np.testing.assert_array_equal(g, w)
  assert max(seen) < 10_000 < len(texts[-1])


PEAK_RSS = """
import resource, sys
from jaxencoder.data import readers
sizes = [len(e["text"]) for e in readers.read_documents(sys.argv[1], unit=sys.argv[2])]
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "count": len(sizes), "longest": max(sizes), "chars": sum(sizes)}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("unit", ["paragraph", "file"])
def test_reading_a_60_mb_line_stays_under_its_bound(tmp_path, unit):
  """Before chunking this held the file about 5 times over (over 300 MB for 60 MB)."""
  path = tmp_path / "one.txt"
  with open(path, "w") as f:
    for seed in range(64):
      f.write(long_line(200_000, seed) + " ")  # about 1 MB each, no newline
  size = path.stat().st_size
  small = tmp_path / "small.txt"
  small.write_text("a few words")
  read = lambda file: subprocess.run([sys.executable, "-c", "import json\n" + PEAK_RSS,
                                      str(file), unit], capture_output=True, text=True,
                                     timeout=300)
  run, base = read(path), read(small)
  assert run.returncode == 0 and base.returncode == 0, run.stderr[-2000:] + base.stderr[-2000:]
  result, idle = json.loads(run.stdout), json.loads(base.stdout)
  bound = readers.MAX_DOCUMENT_CHARS
  assert result["longest"] <= bound and result["count"] > size // bound
  assert result["chars"] >= size - result["count"]  # only the whitespace at cuts is gone
  assert result["peak_mb"] - idle["peak_mb"] < 48, (result, idle)
