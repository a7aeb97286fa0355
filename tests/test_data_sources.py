"""Where a training run's data comes from: a source it cannot find is one line naming what
exists; a dataset of one file gets a held-out eval split."""

import logging

import ml_collections
import pytest

from jaxencoder.data import builders, sources
from jaxencoder.data.readers import DataError
from jaxencoder.data.splits import Holdout, open_splits

FETCHABLE = ("shakespeare, fashion_mnist, wsj_pos, fine_foods, austen, shakespeare_span, "
             "shakespeare_multilabel, shakespeare_regression, shakespeare_choice, "
             "shakespeare_pairs, shakespeare_speeches, shakespeare_halves, shakespeare_retrieval, "
             "agreement_pairs, "
             "ucr/<NAME>")


def data_config(tmp_path, source, **fields):
  return ml_collections.ConfigDict({"source": source, "data_dir": str(tmp_path),
                                    "eval_split": "", "holdout_every": 3, **fields})


def one_csv(tmp_path, rows: int = 7):
  """text_classification/one: a single train.csv of `rows` rows."""
  src = tmp_path / "one"
  src.mkdir()
  lines = [f"text number {i},{'ab'[i % 2]}" for i in range(rows)]
  (src / "train.csv").write_text("text,label\n" + "\n".join(lines) + "\n")
  builders.prepare("text_classification", src, tmp_path / "tfds", name="one")
  return "text_classification/one"


def failure(tmp_path, source) -> str:
  with pytest.raises(DataError) as error:
    open_splits(data_config(tmp_path, source), source)
  return str(error.value)


# ------------------------------------------------------------ one file, a held-out split
def test_one_file_with_an_eval_split_named_holds_out_train_examples(tmp_path, caplog):
  name = one_csv(tmp_path)
  with caplog.at_level(logging.WARNING, logger="jaxencoder"):
    train, eval_ = open_splits(data_config(tmp_path, name, eval_split="test"), name)
  assert isinstance(eval_, Holdout) and (len(train), len(eval_)) == (4, 3)  # 0, 3, 6 held
  texts = lambda split: {split[i]["text"].decode() for i in range(len(split))}  # noqa: E731
  assert texts(train) | texts(eval_) == {f"text number {i}" for i in range(7)}
  assert not texts(train) & texts(eval_)
  assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == [
      "text_classification/one: no split 'test', only train: holding out 1 in 3 train "
      "examples for eval (data.holdout_every; data.eval_split='' says so)"]


def test_a_missing_eval_split_beside_others_names_both_fixes(tmp_path):
  src = tmp_path / "two"
  src.mkdir()
  (src / "train.csv").write_text("text,label\na,x\nb,y\n")
  (src / "validation.csv").write_text("text,label\nc,x\n")
  builders.prepare("text_classification", src, tmp_path / "tfds", name="two")
  with pytest.raises(DataError) as error:
    open_splits(data_config(tmp_path, "", eval_split="test"), "text_classification/two")
  assert str(error.value) == (
      "text_classification/two: no split 'test' to evaluate on (has train, validation): set "
      "--config.data.eval_split to one of them, or '' to hold out 1 in "
      "data.holdout_every=3 train examples")


# ----------------------------------------------------------- a source that is not there
def test_a_path_that_does_not_exist_is_one_line(tmp_path):
  one_csv(tmp_path)
  assert failure(tmp_path, str(tmp_path / "nope")) == (
      f"{tmp_path}/nope: no such file or directory: data.source takes a fetch source "
      f"({FETCHABLE}), a dataset prepared under {tmp_path}/tfds (text_classification/one) as "
      "KIND/NAME, or a prepared dataset's directory")


def test_an_empty_directory_says_what_was_looked_for(tmp_path):
  (tmp_path / "empty").mkdir()
  assert failure(tmp_path, str(tmp_path / "empty")) == (
      f"no prepared dataset at {tmp_path}/empty: looked for dataset_info.json or "
      "token_ids/manifest.json (in it or a version folder), found nothing; prepare it first: "
      f"jaxencoder-data prepare KIND --source {tmp_path}/empty --data-dir DATA_DIR --name "
      "NAME, then data.source=KIND/NAME")


def test_a_folder_of_csv_files_names_the_prepare_command(tmp_path):
  (tmp_path / "csvs").mkdir()
  for split in ("train", "test"):
    (tmp_path / "csvs" / f"{split}.csv").write_text("text,label\na,b\n")
  assert failure(tmp_path, str(tmp_path / "csvs")).endswith(
      "found 2 .csv files; prepare it first: jaxencoder-data prepare text_classification "
      f"--source {tmp_path}/csvs --data-dir DATA_DIR --name NAME, then "
      "data.source=text_classification/NAME")


def test_a_misspelled_source_name_gets_a_did_you_mean(tmp_path):
  assert failure(tmp_path, "shakespear") == (
      "unknown data source 'shakespear' (did you mean 'shakespeare'?): data.source takes a "
      f"fetch source ({FETCHABLE}), a dataset prepared under {tmp_path}/tfds (none yet) as "
      "KIND/NAME, or a prepared dataset's directory")


def test_a_misspelled_prepared_name_suggests_its_kind_and_name(tmp_path):
  one_csv(tmp_path)
  assert "(did you mean 'text_classification/one'?)" in failure(tmp_path, "oen")


def test_the_split_names_of_a_prepared_dataset(tmp_path):
  one_csv(tmp_path)
  assert sources.split_names("text_classification/one", tmp_path / "tfds") == ["train"]
