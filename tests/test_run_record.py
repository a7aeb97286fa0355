"""A run carries its own truth (run_record.json): its tokenizer copy and sha256, its label
names and each split's fingerprint; resume, predict and the converters read those, and a
dataset re-prepared under the same name is refused on resume unless allowed."""

import json
import logging
import os
import pathlib
import shutil

import pytest

import train_helpers as th
from jaxencoder.data import builders
from jaxencoder.io import run_record
from jaxencoder.io.run_dir import RunDir
from jaxencoder.train import predict, provenance
from jaxencoder.train.init_from import finalized
from jaxencoder.train.loop import setup, train_and_evaluate
from jaxencoder.train.resume import ConfigChangedError

RUN = "run"


def classify_config():
  """A 2-step classifier over ./tfds/text_classification/cls, every path relative (a copy
  of the folder is the same run)."""
  config = th.tiny_config(pathlib.Path("."), "text_classification/cls", pathlib.Path("vocab.txt"))
  config.task, config.data.kind, config.data.eval_split = "classify", "text_classification", "test"
  config.num_train_steps, config.eval_every, config.checkpoint_every = 2, 2, 2
  return config


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A folder with vocab.txt, the prepared dataset (its sources in cls/) and a 2-step run."""
  root = tmp_path_factory.mktemp("record")
  with pytest.MonkeyPatch.context() as patch:
    patch.chdir(root)
    th.write_vocab(pathlib.Path("."))
    th.classification_set(pathlib.Path("."))
    train_and_evaluate(classify_config(), RUN)
  return root


@pytest.fixture
def here(trained, tmp_path, monkeypatch, caplog):
  """A copy of the trained folder, as the working directory."""
  shutil.copytree(trained, tmp_path / "w")
  monkeypatch.chdir(tmp_path / "w")
  caplog.set_level(logging.INFO, logger="jaxencoder")
  return tmp_path / "w"


def snapshot(root: pathlib.Path) -> dict[str, bytes]:
  return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
          if p.is_file()}


def reprepare(rewrite, splits=("train",)) -> None:
  """Rewrites the rows of cls/<split>.csv with `rewrite` and prepares the dataset again."""
  for split in splits:
    csv = pathlib.Path(f"cls/{split}.csv")
    csv.write_text(rewrite(csv.read_text()))
  builders.prepare("text_classification", "cls", "tfds", name="cls")


# --- what a run stores ------------------------------------------------------------------
def test_a_run_stores_its_tokenizer_copy_labels_and_split_fingerprints(here):
  record = run_record.read(RUN)
  files = record["tokenizer"]["files"]
  assert set(files) == {"tokenizer.json", "vocab.txt"}
  for name, digest in files.items():
    assert run_record.sha256_file(pathlib.Path(RUN) / name) == digest
  assert (pathlib.Path(RUN) / "vocab.txt").read_text() == pathlib.Path("vocab.txt").read_text()
  assert record["labels"] == ["no", "yes"]
  assert [e["split"] for e in record["data"]["train"]] == ["train"]
  assert [e["split"] for e in record["data"]["eval"]] == ["test"]
  assert (record["data"]["train"][0]["examples"], record["data"]["eval"][0]["examples"]) == (64, 16)
  assert record["changes"] == []


# --- a dataset re-prepared under the same name ------------------------------------------
def test_resume_on_a_reprepared_dataset_is_refused_naming_the_change(here):
  reprepare(lambda text: text + "cat dog,yes\n")
  before = snapshot(here / RUN)
  config = classify_config()
  config.num_train_steps = 4
  with pytest.raises(provenance.DataChangedError) as refusal:
    train_and_evaluate(config, RUN)
  line = str(refusal.value)
  assert "\n" not in line
  assert "split 'train'" in line and "64 -> 65 examples" in line and "changed train.csv" in line
  assert "--config.data.allow_changed_data=True" in line
  assert snapshot(here / RUN) == before


@pytest.mark.slow
def test_allow_changed_data_resumes_with_a_warning_a_metrics_row_and_the_record_updated(
    here, caplog):
  reprepare(lambda text: text + "cat dog,yes\n")
  config = classify_config()
  config.num_train_steps, config.data.allow_changed_data = 4, True
  train_and_evaluate(config, RUN)
  assert any("resuming on changed data" in m and "64 -> 65 examples" in m
             for m in caplog.messages)
  rows = [json.loads(l) for l in (here / RUN / "metrics.jsonl").read_text().splitlines()]
  switch = [r for r in rows if r["split"] == "data_changed"]
  assert len(switch) == 1 and switch[0]["step"] == 2
  assert (switch[0]["train_examples_before"], switch[0]["train_examples_after"]) == (64, 65)
  record = run_record.read(RUN)
  assert record["data"]["train"][0]["examples"] == 65
  assert [c["step"] for c in record["changes"]] == [2]
  assert RunDir.open(RUN).latest_step() == 4


def test_a_class_added_is_refused_even_when_changed_data_is_allowed(here):
  reprepare(lambda text: text + "cat dog,maybe\n")
  config = classify_config()
  config.num_train_steps, config.data.allow_changed_data = 4, True
  with pytest.raises(provenance.DataChangedError, match=r"labels \[no, yes\] -> \[maybe, no, "
                     r"yes\].*head has 2 outputs, the data now have 3 classes"):
    train_and_evaluate(config, RUN)


# --- labels from the past ---------------------------------------------------------------
def test_predict_names_classes_as_the_run_stored_them_after_a_label_is_renamed(here):
  reprepare(lambda text: text.replace(",yes", ",oui"), splits=("train", "test"))
  p = predict.load(RUN)
  assert p.label_names == ["no", "yes"]
  outputs = predict.predictions(p, ["the cat sat", "a dog ran"]).outputs
  assert {line.split("\t")[0] for line in outputs} <= {"no", "yes"}


def test_predict_of_an_old_run_after_a_class_was_added_says_the_dataset_changed(here):
  (here / RUN / run_record.RECORD).unlink()  # a run from before records
  reprepare(lambda text: text + "cat dog,maybe\n")
  with pytest.raises(predict.UnsupportedRun, match="its dataset changed since training: it "
                     "now has 3 classes.*the checkpoints are intact"):
    predict.load(RUN)


# --- the tokenizer is the run's own -----------------------------------------------------
def test_a_tokenizer_changed_in_place_is_not_read_on_resume(here, caplog):
  vocab = pathlib.Path("vocab.txt")
  original = vocab.read_text().splitlines()
  shuffled = original[:5] + original[5:][::-1]  # specials kept, every word another id
  vocab.write_text("\n".join(shuffled) + "\n")
  run = setup(finalized(classify_config()), RUN, read_only=True)
  ids = run.pipelines.tokenizer.encode("the cat sat")["input_ids"]
  expected = th_tokenizer(original).encode("the cat sat")["input_ids"]
  assert list(ids) == list(expected)
  assert any("data.tokenizer vocab.txt changed since the run copied it" in m
             for m in caplog.messages)


def th_tokenizer(tokens):
  from jaxencoder.tokenizer import Tokenizer
  return Tokenizer.from_vocab(tokens)


def test_a_changed_copy_of_the_runs_tokenizer_is_one_line_naming_the_file(here):
  copy = here / RUN / "vocab.txt"
  copy.write_text(copy.read_text().replace("cat", "kat"))
  with pytest.raises(run_record.RecordMismatch, match=r"vocab.txt: the run's copy of its "
                     "tokenizer was changed since the run stored it"):
    predict.load(RUN)
  with pytest.raises(run_record.RecordMismatch):
    setup(finalized(classify_config()), RUN, read_only=True)


@pytest.mark.slow
def test_a_run_made_before_records_gets_one_once_with_a_warning(here, caplog):
  run = here / RUN
  for name in (run_record.RECORD, "tokenizer.json", "vocab.txt"):
    (run / name).unlink()
  longer = classify_config()  # a finished run's rerun does nothing: train on, 2 more steps
  longer.num_train_steps = 4
  train_and_evaluate(longer, RUN)  # resumes: writes the record
  assert sum("has no run_record.json" in m for m in caplog.messages) == 1
  record = run_record.read(RUN)
  assert record["labels"] == ["no", "yes"] and (run / "vocab.txt").exists()
  caplog.clear()
  longer.num_train_steps = 6
  train_and_evaluate(longer, RUN)
  assert not any("has no run_record.json" in m for m in caplog.messages)


# --- the stored config is compared before any array is read ----------------------------
def test_a_changed_width_is_refused_before_restoring_with_no_false_damage_warnings(here, caplog):
  config = classify_config()
  config.model.emb_dim, config.model.mlp_dim = 48, 96
  before = snapshot(here / RUN)
  with pytest.raises(ConfigChangedError, match="model.emb_dim: 32 -> 48"):
    train_and_evaluate(config, RUN)
  assert not any("cannot be restored" in m for m in caplog.messages)
  assert snapshot(here / RUN) == {k: v for k, v in before.items()}


# --- from the command line --------------------------------------------------------------
CONFIG_FILE = '''import sys
sys.path.insert(0, {tests!r})
import test_run_record


def get_config():
  return test_run_record.classify_config()
'''


def test_train_py_refuses_changed_data_in_one_line_with_exit_2(here, capsys, monkeypatch):
  from jaxencoder.train import stop
  from jaxencoder.train.__main__ import main as train_main
  monkeypatch.setattr(stop, "exit_on_second_interrupt", stop.exit_on_second_interrupt)
  pathlib.Path("cfg.py").write_text(CONFIG_FILE.format(tests=str(pathlib.Path(__file__).parent)))
  reprepare(lambda text: text + "cat dog,yes\n")
  before = snapshot(here / RUN)
  with pytest.raises(SystemExit) as exit_info:
    train_main(["--config", "cfg.py", "--workdir", RUN, "--config.num_train_steps=4"])
  assert exit_info.value.code == 2
  err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
  assert len(err) == 1 and "was trained on other data" in err[0]
  assert snapshot(here / RUN) == before
