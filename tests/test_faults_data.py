"""Issue 30, item 2: data means what it says. Pixels and labels keep their values or are
refused by name; degenerate masked objectives and tokenizers that do not fit the model
are refused before anything compiles."""

import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

import train_helpers as th
from data_helpers import VOCAB, tiny_tokenizer
from jaxencoder.model.config import EncoderConfig
from jaxencoder.data import builders, readers
from jaxencoder.tokenizer import Tokenizer, check_fits
from jaxencoder.train.config import base_config, finalize

REPO = pathlib.Path(__file__).resolve().parents[1]


def _npz(tmp_path, images, labels, name="train.npz") -> pathlib.Path:
  path = tmp_path / "img" / name
  path.parent.mkdir(exist_ok=True)
  np.savez(path, images=images, labels=labels)
  return path


# --- pixels -------------------------------------------------------------------------------
@pytest.mark.parametrize("images,expected", [
    (np.array([0, 7, 255], np.uint8), [0, 7, 255]),
    (np.array([0.0, 0.5, 1.0], np.float32), [0, 128, 255]),  # [0, 1]: x 255, rounded
    (np.array([0.0, 2.0, 255.0]), [0, 2, 255]),  # [0, 255] (max > 1), integral: kept
    (np.array([0.0, 2.4, 254.6]), [0, 2, 255]),  # [0, 255], fractional: rounded
    (np.array([0, 3, 255], np.int64), [0, 3, 255]),
    (np.array([0, 257, 65535], np.uint16), [0, 1, 255]),  # 16-bit: / 257, rounded
])
def test_pixels_keep_their_values(images, expected):
  out = readers.pixel_bytes(images, "x.npz: split train")
  assert out.dtype == np.uint8 and out.tolist() == expected


@pytest.mark.parametrize("images,message", [
    (np.array([0, 300, 65], np.int32), r"values 0\.\.300 \(int32\) do not map to 0\.\.255"),
    (np.array([-1.0, 0.5]), r"values -1\.\.0\.5 \(float64\) do not map to 0\.\.255"),
    (np.array([0.0, 256.0]), r"values 0\.\.256 \(float64\) do not map"),
    (np.array([0.0, np.nan]), r"images hold NaN"),
    (np.array([0, 200], np.uint16), r"uint16 images with values 0\.\.200 \(uint16\): 8-bit "
                                    r"pixels or a dark 16-bit image\? Cast them to uint8"),
    (np.array([True, False]), r"images of dtype bool are not pixel values"),
])
def test_pixels_that_do_not_map_to_bytes_are_refused_by_file_and_split(images, message):
  with pytest.raises(readers.DataError, match=r"^x\.npz: split test: .*" + message):
    readers.pixel_bytes(images, "x.npz: split test")


def test_float_images_in_0_1_are_stored_scaled_not_as_zeros(tmp_path):
  images = np.full((2, 2, 2), 0.5, np.float32)
  _npz(tmp_path, images, np.array([0, 1]))
  pixels, labels = readers.read_image_pairs(tmp_path / "img")["train"]
  assert pixels.dtype == np.uint8 and set(pixels.ravel().tolist()) == {128}
  assert labels.tolist() == [0, 1]


def test_uint16_images_that_would_wrap_are_refused_naming_the_file(tmp_path):
  path = _npz(tmp_path, np.array([[[100, 200]]], np.uint16), np.array([0]))
  with pytest.raises(readers.DataError, match=rf"^{path}: split train: uint16 images with "
                                              r"values 100\.\.200"):
    readers.read_image_pairs(tmp_path / "img")


# --- labels -------------------------------------------------------------------------------
def test_integral_float_labels_become_ints():
  assert readers.integer_labels(np.array([2.0, 0.0]), "x").tolist() == [2, 0]
  assert readers.integer_labels(np.array([2.0, 0.0]), "x").dtype == np.int64


@pytest.mark.parametrize("labels,message", [
    (np.array([1.0, 2.7]), r"label 2\.7 at index 1 is not an integer \(1 such\)"),
    (np.array([np.nan]), r"label nan at index 0 is not an integer"),
    (np.array(["cat", "dog"]), r"labels of dtype <U3 are not class numbers"),
])
def test_labels_that_are_not_integers_are_refused_not_truncated(tmp_path, labels, message):
  path = _npz(tmp_path, np.zeros((len(labels), 2, 2), np.uint8), labels)
  with pytest.raises(readers.DataError, match=rf"^{path}: split train: {message}"):
    readers.read_image_pairs(tmp_path / "img")


def test_one_number_spelled_two_ways_is_refused_at_the_second(tmp_path):
  path = tmp_path / "train.csv"
  path.write_text("text,label\na cat,1\na dog,0\nthe cat,1.0\n")
  with pytest.raises(readers.DataError, match=rf"^{path}:4: label '1\.0' spells the same number "
                                              rf"as label '1' \({path}:2\)"):
    list(readers.read_classification(path))
  readers.check_spellings([("pos", "a:1"), ("1", "a:2"), ("1", "a:3"), ("10", "a:4")])


def _classification_src(tmp_path, train: str, test: str) -> pathlib.Path:
  src = tmp_path / "src"
  src.mkdir()
  (src / "train.csv").write_text("text,label\n" + train)
  (src / "test.csv").write_text("text,label\n" + test)
  return src


def test_spellings_are_compared_across_the_files_of_a_dataset(tmp_path):
  src = _classification_src(tmp_path, "a cat,1\na dog,0\n", "the cat,01\n")  # test.csv first
  with pytest.raises(readers.DataError, match=rf"^{src}/train.csv:2: label '1' spells the same "
                                              rf"number as label '01' \({src}/test.csv:2\)"):
    builders.prepare("text_classification", src, tmp_path / "tfds", name="c")


def test_a_class_only_the_test_split_has_is_refused_at_prepare(tmp_path):
  src = _classification_src(tmp_path, "a cat,pos\na dog,neg\n", "the cat,pos\nan owl,meh\n")
  with pytest.raises(readers.DataError, match=rf"^{src}/test.csv:3: split test has class 'meh', "
                                              r"which the train split lacks \(1 such"):
    builders.prepare("text_classification", src, tmp_path / "tfds", name="c")


def test_an_image_class_only_the_test_split_has_is_refused():
  firsts = {"train": {0: "a", 1: "b"}, "test": {0: "c", 3: "d: split test, example 5"}}
  with pytest.raises(readers.DataError, match=r"^d: split test, example 5: split test has "
                                              r"class 3, which the train split lacks"):
    builders.check_train_has_all(firsts)
  builders.check_train_has_all({"test": {3: "x"}})  # no train split: nothing to compare


# --- a task with too few classes -------------------------------------------------------------
def _one_class_config(tmp_path, kind: str, task: str, source: str):
  config = base_config()
  config.task, config.data.kind, config.data.source = task, kind, source
  config.data.data_dir = str(tmp_path)
  return config


def _labelled(tmp_path, kind: str) -> str:
  """A dataset of `kind` (under tmp_path/tfds, as kind/one) whose labels name one class."""
  src = tmp_path / "src"
  src.mkdir(exist_ok=True)
  if kind == "text_classification":
    (src / "train.csv").write_text("text,label\na cat,pos\na dog,pos\n")
  elif kind == "tagged_tokens":
    (src / "train.txt").write_text("the/DET cat/DET\na/DET dog/DET\n")
  else:
    np.savez(src / "train.npz", images=np.zeros((4, 8, 8), np.uint8), labels=np.zeros(4, int))
  builders.prepare(kind, src, tmp_path / "tfds", name="one")
  return f"{kind}/one"


@pytest.mark.parametrize("kind, task, names, listed", [
    ("text_classification", "classify", "'pos'", True),
    ("tagged_tokens", "token_classify", "'DET'", True),
    ("image_arrays", "classify", "'0'", False)])
def test_a_set_with_one_class_is_refused_for_a_task_that_learns_classes(
    tmp_path, kind, task, names, listed):
  from jaxencoder.train import datasets
  source = _labelled(tmp_path, kind)
  with pytest.raises(readers.DataError) as error:
    datasets.check_classes(_one_class_config(tmp_path, kind, task, source), source)
  labels_txt = ", or a labels.txt beside its source files naming every class" if listed else ""
  assert str(error.value) == (
      f"{source}: its labels name 1 class ({names}); task={task} needs 2 or more to learn "
      f"anything: add examples of another class{labels_txt}, and prepare it again")


def test_one_class_is_accepted_where_classes_are_not_learnt_or_labels_txt_names_more(tmp_path):
  """contrastive reads only the texts; multilabel learns yes / no for each label, so one
  label is a task; a labels.txt naming both classes makes two."""
  from jaxencoder.train import datasets
  source = _labelled(tmp_path, "text_classification")
  datasets.check_classes(_one_class_config(tmp_path, "text_classification", "contrastive",
                                           source), source)
  (tmp_path / "records").mkdir()
  (tmp_path / "records" / "train.csv").write_text("text,labels\na cat,cat\na dog,\n")
  builders.prepare("text_records", tmp_path / "records", tmp_path / "tfds", name="tags")
  datasets.check_classes(_one_class_config(tmp_path, "text_records", "multilabel",
                                           "text_records/tags"), "text_records/tags")
  (tmp_path / "src" / "labels.txt").write_text("neg\npos\n")
  builders.prepare("text_classification", tmp_path / "src", tmp_path / "tfds", name="one")
  datasets.check_classes(_one_class_config(tmp_path, "text_classification", "classify",
                                           source), source)


def test_train_main_refuses_a_one_class_set_in_one_line_and_leaves_no_workdir(
    tmp_path, capsys, monkeypatch):
  from jaxencoder import cli
  from jaxencoder.train import stop
  from jaxencoder.train.__main__ import main
  monkeypatch.setenv("JAXENCODER_VERBOSE", "1")  # main() leaves the library loggers as they are
  monkeypatch.setattr(stop, "exit_on_second_interrupt", stop.exit_on_second_interrupt)
  source, vocab = _labelled(tmp_path, "text_classification"), th.write_vocab(tmp_path)
  workdir = tmp_path / "runs" / "one"
  overrides = {"task": "classify", "data.kind": "text_classification", "data.source": source,
               "data.data_dir": tmp_path, "data.tokenizer": vocab, "model.vocab_size": len(VOCAB),
               "model.num_layers": 1, "batch_size": 8, "eval_batch_size": 8,
               "progress_bar": False}
  with pytest.raises(SystemExit) as exit_:
    main(["--config", str(REPO / "configs/mlm_tiny.py"), "--workdir", str(workdir),
          *[f"--config.{key}={value}" for key, value in overrides.items()]])
  assert exit_.value.code == cli.EXIT_USER_ERROR
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
      f"error: {source}: its labels name 1 class ('pos'); task=classify needs 2 or more to "
      "learn anything: add examples of another class, or a labels.txt beside its source files "
      "naming every class, and prepare it again")
  assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("column,value,message", [
    ("label", "1_0", "is not an integer"), ("label", "2.7", "is not an integer"),
    ("answer_start", "inf", "is not an integer"), ("target", "nan", "is not a finite number"),
    ("target", "1_0", "is not a finite number")])
def test_record_numbers_are_read_exactly(column, value, message):
  with pytest.raises(readers.DataError, match=rf"^f.csv:3: column '{column}' = '{value}' "
                                              + message):
    builders._record({column: value, "origin": "f.csv:3"}, ())
  assert builders._record({"label": "+3", "target": "-0.5", "origin": "o"}, ()) == {
      "label": 3, "target": -0.5, "origin": "o"}


# --- degenerate objectives -----------------------------------------------------------------
@pytest.mark.parametrize("task,key,value,message", [
    ("mlm", "mask_rate", 0.0, "data.mask_rate=0.0 must lie in (0, 1) for task 'mlm'"),
    ("mlm", "mask_rate", 1.0, "data.mask_rate=1.0 must lie in (0, 1) for task 'mlm'"),
    ("electra", "mask_rate", 0.0, "data.mask_rate=0.0 must lie in (0, 1) for task 'electra'"),
    ("mlm", "seq_len", 1, "data.seq_len=1 is too short for task 'mlm': the minimum is 3"),
    ("mlm", "seq_len", 2, "data.seq_len=2 is too short for task 'mlm': the minimum is 3"),
    ("nsp", "seq_len", 4, "data.seq_len=4 is too short for task 'mlm_nsp': the minimum is 5"),
])
def test_degenerate_masked_objectives_are_refused_before_building(task, key, value, message):
  config = base_config()
  config.task = "mlm" if task == "nsp" else task
  config.sentence_pair = "nsp" if task == "nsp" else ""
  config.data[key] = value
  with pytest.raises(ValueError) as error:
    finalize(config)
  assert str(error.value).startswith(message)


def test_the_shortest_masked_rows_and_their_predictions_are_accepted():
  config = base_config()
  config.data.seq_len = 3
  assert finalize(config).max_predictions <= 3
  config = base_config()
  config.max_predictions = 129
  with pytest.raises(ValueError, match=r"^max_predictions=129 exceeds data.seq_len=128"):
    finalize(config)


def test_a_high_mask_rate_gets_at_most_one_automatic_prediction_per_position():
  config = base_config()
  config.data.mask_rate = 0.85  # 1.25 x 0.85 x 128 + 1 = 137 predictions: more than 128 rows
  assert finalize(config).max_predictions == 128


# --- tokenizers meet models ----------------------------------------------------------------
def test_a_tokenizer_larger_than_the_table_is_refused_naming_both_sizes():
  tok = tiny_tokenizer()
  with pytest.raises(ValueError, match=rf"^vocab.txt: the tokenizer has {tok.vocab_size} tokens "
                                       rf"but the model's embedding table has 5 rows"):
    check_fits(tok, EncoderConfig(vocab_size=5), "vocab.txt")
  check_fits(tok, EncoderConfig(vocab_size=30522), "vocab.txt")  # a padded table: fine


def test_another_models_tokenizer_is_refused_for_a_pretrained_table():
  tok = tiny_tokenizer()
  with pytest.raises(ValueError, match=rf"^t: the tokenizer has {tok.vocab_size} tokens but the "
                                       r"checkpoint's embedding table has 30522 rows"):
    check_fits(tok, EncoderConfig(vocab_size=30522), "t", trained_table=True)
  check_fits(tok, EncoderConfig(vocab_size=tok.vocab_size + 88), "t", trained_table=True)


def test_special_ids_must_be_where_the_checkpoint_expects_them():
  tok = tiny_tokenizer()
  cfg = EncoderConfig(vocab_size=64)
  check_fits(tok, cfg, "t", expected={"pad_token_id": tok.pad_id, "cls_token_id": tok.cls_id})
  with pytest.raises(ValueError, match=rf"^t: the checkpoint expects its \[PAD\] / <pad> token "
                                       rf"at id 1 \(pad_token_id\), the tokenizer has it at id "
                                       rf"{tok.pad_id}"):
    check_fits(tok, cfg, "t", expected={"pad_token_id": 1})
  roberta = cfg.replace(family="roberta", position_offset=2)  # RoBERTa: pad id 1
  with pytest.raises(ValueError, match=r"expects its \[PAD\] / <pad> token at id 1"):
    check_fits(tok, roberta, "t")


def test_a_roberta_export_with_its_own_wordpiece_vocab_loads_back(tmp_path):
  """The export writes RobertaConfig's bos / eos ids 0 and 2 whatever the vocab ([CLS]
  is 2 here); no encoder reads them, so they are not checked: only pad_token_id is."""
  import jax
  import jax.numpy as jnp
  from jaxencoder.model.encoder import Encoder
  from jaxencoder.pretrained import hf_checkpoint
  tok = tiny_tokenizer()
  cfg = EncoderConfig(vocab_size=64, emb_dim=32, num_layers=1, num_heads=4, mlp_dim=64,
                      max_len=34, family="roberta", position_offset=tok.pad_id + 1,
                      type_vocab_size=1)
  ids = jnp.ones((1, 8), jnp.int32)
  params = Encoder(cfg).init(jax.random.PRNGKey(0), ids, ids)["params"]
  hf_checkpoint.save(tmp_path / "hf", cfg, params, tok)
  loaded_cfg, _, loaded_tok = hf_checkpoint.load(tmp_path / "hf")
  assert loaded_tok.cls_id == 2
  hf_checkpoint.check_tokenizer(tmp_path / "hf", loaded_cfg, loaded_tok, "t")


@pytest.fixture
def minilm_with_small_tokenizer(minilm, tmp_path):
  """The MiniLM checkpoint (30,522 rows) with another, 2,000-token-or-so tokenizer."""
  hf = tmp_path / "hf"
  hf.mkdir()
  for name in ("config.json", "model.safetensors"):
    (hf / name).symlink_to(pathlib.Path(minilm) / name)
  (hf / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  return hf


def test_probing_a_hf_dir_whose_tokenizer_is_another_models_is_refused(
    minilm_with_small_tokenizer):
  from jaxencoder.probing.load import load_pretrained
  hf = minilm_with_small_tokenizer
  with pytest.raises(ValueError, match=rf"^tokenizer {hf}: the tokenizer has {len(VOCAB)} tokens "
                                       r"but the checkpoint's embedding table has 30522 rows"):
    load_pretrained(hf)


def test_embedding_with_a_sentence_dir_whose_tokenizer_is_another_models_is_refused(
    minilm, tmp_path):
  from jaxencoder.pretrained import embed
  st = tmp_path / "st"
  st.mkdir()
  for entry in pathlib.Path(minilm).iterdir():  # MiniLM's sentence-transformers dir, ...
    if entry.name not in ("tokenizer.json", "vocab.txt"):
      (st / entry.name).symlink_to(entry)
  (st / "vocab.txt").write_text("\n".join(VOCAB) + "\n")  # ... with another vocab
  with pytest.raises(ValueError, match=rf"^{st}'s tokenizer: the tokenizer has {len(VOCAB)} "
                                       r"tokens but the checkpoint's embedding table has 30522"):
    embed(["a sentence"], st, progress=False)


@pytest.mark.slow
def test_a_dir_converted_without_a_tokenizer_says_so_and_is_never_given_minilms(minilm, tmp_path):
  from jaxencoder.io.run_dir import RunDir
  from jaxencoder.pretrained.convert import convert
  from jaxencoder.probing.load import load_checkpoint
  hf = tmp_path / "hf"
  hf.mkdir()
  for name in ("config.json", "model.safetensors"):
    shutil.copy(pathlib.Path(minilm) / name, hf / name)
  summary = convert(hf, tmp_path / "run")
  assert summary.endswith(f"(its architecture comes along, but no tokenizer: {hf} has no "
                          "tokenizer.json / vocab.txt / vocab.json, so set data.tokenizer to "
                          "the vocab it was trained with)")
  with pytest.raises(ValueError, match=rf"^{tmp_path / 'run'}: no tokenizer files \(converted "
                                       r"without them\).*: pass --tokenizer"):
    load_checkpoint(tmp_path / "run")
  assert RunDir.open(tmp_path / "run").tokenizer_path() is None


@pytest.mark.slow
def test_train_py_with_mask_rate_0_exits_2_with_one_line(tmp_path):
  command = [sys.executable, str(REPO / "train.py"), "--config", str(REPO / "configs/mlm_tiny.py"),
             "--workdir", str(tmp_path / "run"), "--config.data.mask_rate=0"]
  result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
      "error: data.mask_rate=0.0 must lie in (0, 1) for task 'mlm': the fraction of tokens "
      "masked (BERT: 0.15)")
  assert "Traceback" not in result.stderr and not (tmp_path / "run" / "checkpoints").exists()


def test_training_refuses_a_tokenizer_larger_than_the_model_table(tmp_path):
  from types import SimpleNamespace
  from jaxencoder.train import loop
  vocab = th.write_vocab(tmp_path)
  config = finalize(th.tiny_config(tmp_path, "unused", vocab, vocab_size=8))
  pipelines = SimpleNamespace(tokenizer=Tokenizer.from_file(vocab), num_classes=None)
  with pytest.raises(ValueError, match=rf"^data.tokenizer={vocab}: the tokenizer has {len(VOCAB)} "
                                       r"tokens but the model's embedding table has 8 rows"):
    loop.build_task(config, pipelines)
