"""Data is never silently stale or wrong: prepare notices changed sources, CSV columns go by
header name, encodings and long fields work, errors name file:line, tiny splits and
out-of-range ids are one-line errors."""

import logging
import os
import pathlib
import subprocess
import sys

import grain
import ml_collections
import numpy as np
import pytest

import train_helpers as th
from gcs_emulator import gcs  # noqa: F401 (fixture)
from jaxencoder.data import builders, pipeline, readers, sources
from jaxencoder.data import __main__ as data_cli
from jaxencoder.io.paths import as_path
from jaxencoder.train.config import finalize
from jaxencoder.train.datasets import make_pipelines, resolve_source

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def info_logs(caplog):
  caplog.set_level(logging.INFO, logger="jaxencoder")
  return caplog


def _csv(root, text, name="train.csv", encoding="utf-8"):
  src = root / "src"
  src.mkdir(exist_ok=True)
  (src / name).write_bytes(text.encode(encoding))
  return src


def _texts(path, split="train"):
  src = sources.open_source(str(path), split)
  return sorted(r["text"].decode() for r in src.__getitems__(list(range(len(src)))))


def _stamps(path):
  """(inode, mtime) of every file of a prepared dataset: equal only if not rewritten."""
  return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in pathlib.Path(path).iterdir()}


def test_a_changed_source_is_rebuilt_and_its_new_rows_seen(tmp_path, info_logs):
  src = _csv(tmp_path, "text,label\nthe cat,yes\n")
  builders.prepare("text_classification", src, tmp_path / "tfds", name="c")
  _csv(tmp_path, "text,label\nthe cat,yes\na dog,no\n")
  path = builders.prepare("text_classification", src, tmp_path / "tfds", name="c")
  assert _texts(path) == ["a dog", "the cat"]
  assert "text_classification/c: sources changed (train.csv): rebuilding" in info_logs.messages


def test_an_unchanged_source_is_up_to_date_and_not_rewritten(tmp_path, info_logs):
  src = _csv(tmp_path, "text,label\nthe cat,yes\n")
  path = builders.prepare("text_classification", src, tmp_path / "tfds", name="c")
  before = _stamps(path)
  builders.prepare("text_classification", src, tmp_path / "tfds", name="c")
  assert _stamps(path) == before
  assert info_logs.messages[-1] == "text_classification/c: up to date (sources unchanged)"


def test_overwrite_rebuilds_unchanged_sources(tmp_path):
  src = _csv(tmp_path, "text,label\nthe cat,yes\n")
  path = builders.prepare("text_classification", src, tmp_path / "tfds", name="c")
  before = _stamps(path)
  builders.prepare("text_classification", src, tmp_path / "tfds", name="c", overwrite=True)
  assert _stamps(path)["dataset_info.json"] != before["dataset_info.json"]


def test_a_changed_option_rebuilds(tmp_path, info_logs):
  (tmp_path / "a.txt").write_text("one\ntwo\n")
  builders.prepare("text_corpus", tmp_path / "a.txt", tmp_path / "tfds", name="t")
  path = builders.prepare("text_corpus", tmp_path / "a.txt", tmp_path / "tfds", name="t",
                          unit="line")
  assert _texts(path) == ["one", "two"]
  assert "options changed (unit: 'paragraph' -> 'line')" in info_logs.messages[-1]


def test_a_failed_rebuild_keeps_the_old_dataset_and_retries(tmp_path):
  src = _csv(tmp_path, "text,label\nthe cat,yes\n")
  path = builders.prepare("text_classification", src, tmp_path / "tfds", name="c")
  _csv(tmp_path, "text,label\n,yes\n")
  for _ in range(2):  # still stale: tried again, not reported up to date
    with pytest.raises(readers.DataError, match=r"train.csv:2: empty text"):
      builders.prepare("text_classification", src, tmp_path / "tfds", name="c")
  assert _texts(path) == ["the cat"]


def test_a_fetched_source_is_rebuilt_by_the_training_pipeline_when_it_changes(tmp_path,
                                                                            info_logs):
  raw = tmp_path / "raw" / "shakespeare"
  raw.mkdir(parents=True)
  (raw / "a_gut.txt").write_bytes("Caf\xe9 one\n".encode("latin-1"))
  (raw / ".complete").write_text("ok\n")
  data_cfg = ml_collections.ConfigDict({"source": "shakespeare", "data_dir": str(tmp_path)})
  path = resolve_source(data_cfg)
  assert resolve_source(data_cfg) == path
  assert info_logs.messages[-1] == "text_corpus/shakespeare: up to date (sources unchanged)"
  (raw / "a_gut.txt").write_bytes("Caf\xe9 two\n".encode("latin-1"))
  assert _texts(resolve_source(data_cfg)) == ["Caf\u00e9 two"]


def test_on_gcs_an_unchanged_source_is_up_to_date_and_a_change_replaces_every_object(
    gcs, info_logs):
  as_path(gcs.url("trust/raw/a.txt")).write_text("one\n\ntwo\n")
  out = builders.prepare("text_corpus", gcs.url("trust/raw"), gcs.url("trust/tfds"), name="g")
  builders.prepare("text_corpus", gcs.url("trust/raw"), gcs.url("trust/tfds"), name="g")
  assert info_logs.messages[-1] == "text_corpus/g: up to date (sources unchanged)"
  as_path(gcs.url("trust/raw/a.txt")).write_text("three\n")
  stray = "trust/tfds/text_corpus/g/1.0.0/text_corpus-train.array_record-00001-of-00002"
  as_path(gcs.url(stray)).write_text("a shard of an older build")
  builders.prepare("text_corpus", gcs.url("trust/raw"), gcs.url("trust/tfds"), name="g")
  assert _texts(out) == ["three"]
  assert gcs.objects("trust/tfds/") == sorted(
      f"trust/tfds/text_corpus/g/1.0.0/{name}" for name in (
          "dataset_info.json", "features.json", builders.FINGERPRINT,
          "text_corpus-train.array_record-00000-of-00001"))


def test_a_header_without_the_label_column_names_file_and_header(tmp_path):
  src = _csv(tmp_path, "sentence,sentiment\ngood movie,pos\n")
  with pytest.raises(readers.DataError,
                     match=r"train.csv:1: header 'sentence,sentiment' has no column 'label'"):
    builders.prepare("text_classification", src, tmp_path / "tfds", name="s")


def test_label_column_picks_the_label_and_the_other_column_is_the_text(tmp_path):
  src = _csv(tmp_path, "sentence,sentiment\ngood movie,pos\nbad movie,neg\n")
  data_cli.main(["prepare", "text_classification", "--source", str(src), "--data-dir",
                 str(tmp_path), "--name", "s", "--label-column", "sentiment"])
  path = tmp_path / "tfds" / "text_classification" / "s" / "1.0.0"
  assert sources.label_names(str(path)) == ["neg", "pos"]
  assert _texts(path) == ["bad movie", "good movie"]


def test_named_columns_pick_text_pairs_among_extra_columns(tmp_path):
  path = _csv(tmp_path, "id,q,a,y\n1,who,me,yes\n") / "train.csv"
  columns = readers.Columns(text="q", text_b="a", label="y")
  assert list(readers.read_classification(path, columns=columns)) == [
      {"text": "who", "text_b": "me", "label": "yes", "origin": f"{path}:2"}]


def test_a_headerless_file_is_an_error_unless_no_header(tmp_path):
  path = _csv(tmp_path, "good movie,pos\n") / "train.csv"
  with pytest.raises(readers.DataError, match=r"train.csv:1: .*--no-header"):
    list(readers.read_classification(path))
  rows = readers.read_classification(path, columns=readers.Columns(header=False))
  assert list(rows) == [{"text": "good movie", "text_b": "", "label": "pos",
                         "origin": f"{path}:1"}]


def test_a_latin1_csv_reads_with_its_encoding_and_fails_by_line_without(tmp_path):
  src = _csv(tmp_path, "text,label\nthe cat,yes\ncaf\xe9,no\n", encoding="latin-1")
  with pytest.raises(readers.DataError,
                     match=r"train.csv:3: byte 0xe9 is not valid utf-8.*--encoding latin-1"):
    builders.prepare("text_classification", src, tmp_path / "tfds", name="l")
  path = builders.prepare("text_classification", src, tmp_path / "tfds", name="l",
                          encoding="latin-1")
  assert _texts(path) == ["caf\u00e9", "the cat"]


def test_a_200kb_field_is_read_whole(tmp_path):
  long = "cat " * 50_000
  path = _csv(tmp_path, f'text,label\n"{long}",yes\n') / "train.csv"
  assert [r["text"] for r in readers.read_classification(path)] == [long]


def test_a_missing_label_names_file_and_line(tmp_path):
  path = _csv(tmp_path, "text,label\nthe cat,yes\na dog, \n") / "train.csv"
  with pytest.raises(readers.DataError, match=r"train.csv:3: missing label"):
    list(readers.read_classification(path))


def test_line_numbers_count_lines_of_multiline_fields(tmp_path):
  path = _csv(tmp_path, 'text,label\n"two\nlines",yes\n,no\n') / "train.csv"
  with pytest.raises(readers.DataError, match=r"train.csv:4: empty text"):
    list(readers.read_classification(path))


def test_a_one_row_set_is_a_one_line_error_naming_the_split_and_size(tmp_path):
  src = _csv(tmp_path, "text,label\nthe cat,yes\n")
  config = th.tiny_config(tmp_path, str(builders.prepare(
      "text_classification", src, tmp_path / "tfds", name="one")), th.write_vocab(tmp_path))
  config.task, config.data.kind = "classify", "text_classification"
  with pytest.raises(readers.DataError,
                     match=r"split 'train' has 1 example; .*leaves 0 to train on") as e:
    make_pipelines(finalize(config))
  assert "\n" not in str(e.value)


def _batches(input_ids):
  rows = [{"input_ids": np.asarray(r, np.int32)} for r in input_ids]
  return grain.MapDataset.source(rows).to_iter_dataset().batch(2)


@pytest.mark.parametrize("bad", [27, -1])
def test_an_out_of_range_id_names_the_id_and_the_vocab_size(bad):
  ds = pipeline.check_ids(_batches([[2, 5, 3], [2, 6, 3], [2, bad, 3], [2, 5, 3]]),
                          {"input_ids": (27, "model.vocab_size")}, "tokenizer vocab.txt")
  it = iter(ds)
  next(it)  # the first batch is in range
  with pytest.raises(readers.DataError, match=rf"input_ids\[0, 1\] = {bad} is outside "
                     r"\[0, 27\) \(model.vocab_size=27\); ids from tokenizer vocab.txt"):
    next(it)


def test_training_batches_are_checked_against_the_model_vocab(tmp_path):
  corpus = th.text_corpus(tmp_path, docs=20)
  config = th.tiny_config(tmp_path, corpus, th.write_vocab(tmp_path))
  config.model.vocab_size = 12  # smaller than the tokenizer's: its ids reach past
  pipelines = make_pipelines(finalize(config))
  with pytest.raises(readers.DataError, match=r"outside \[0, 12\) \(model.vocab_size=12\); "
                     r"ids from tokenizer .*vocab.txt"):
    next(iter(pipelines.train))


@pytest.mark.slow
def test_prepare_is_quiet_and_the_cli_says_up_to_date_on_a_second_run(tmp_path, capsys,
                                                                       info_logs):
  src = _csv(tmp_path, "text,label\nthe cat,yes\n")
  builders.prepare("text_classification", src, tmp_path / "tfds", name="q")
  noise = ("custom data configuration", "Downloading and preparing", "Subsequent calls")
  seen = capsys.readouterr().out + "\n".join(r.getMessage() for r in info_logs.records)
  assert not any(n in seen for n in noise)
  result = subprocess.run(
      [sys.executable, "-m", "jaxencoder.data", "prepare", "text_classification", "--source",
       str(src), "--data-dir", str(tmp_path), "--name", "q"],
      capture_output=True, text=True, cwd=REPO, timeout=120,
      env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr
  assert result.stderr.strip() == "text_classification/q: up to date (sources unchanged)"
  assert result.stdout.strip().endswith("tfds/text_classification/q/1.0.0")


def test_example_order_does_not_depend_on_where_the_source_lies(tmp_path):
  from jaxencoder.data import sources
  texts = "\n\n".join(f"sentence number {i} about cats" for i in range(40)) + "\n"
  orders = []
  for where in ("a/deep/place", "b"):
    src = tmp_path / where / "src"
    src.mkdir(parents=True)
    (src / "x.txt").write_text(texts)
    builders.prepare("text_corpus", src, tmp_path / where / "tfds", name="c")
    source = sources.open_source("text_corpus/c", "train", tmp_path / where / "tfds")
    orders.append([source[i]["text"] for i in range(len(source))])
  assert orders[0] == orders[1]
