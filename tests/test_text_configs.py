"""The real-data text configs' pieces on tiny data the tests write: the wsj_pos and
fine_foods preparers, and init_from with a Hugging Face directory or `minilm`."""

import json
import lzma
import os
import struct

import chex
import flax.linen as nn
import jax
import numpy as np
import pytest

from conftest import tiny_config
from jaxencoder.model.restore_targets import stored_encoder
from jaxencoder import Encoder
from jaxencoder.data import builders, fetch, sources
from jaxencoder.io.run_dir import RunDir
from jaxencoder.pretrained import save
from jaxencoder.tokenizer import default_tokenizer_path
from jaxencoder.train.config import base_config
from jaxencoder.train.init_from import CONVERTED_FROM, pretrained_run_dir
from jaxencoder.train.init_from import adopt

WSJ = "\n".join([
    "Pierre/NNP Vinken/NNP will/MD join/VB ./. He/PRP agreed/VBD ./.",  # line 0: test
    "The/DT board/NN met/VBD ./.",
    "Prices/NNS rose/VBD 3/CD %/NN ./. No/DT period/NN",  # a last sentence without ./.
] + [f"Line/NN {i}/CD ./." for i in range(3, 12)])  # line 10: test


def test_wsj_pos_holds_out_every_tenth_line_cut_into_sentences(tmp_path):
  fetch.write_wsj_pos(WSJ, tmp_path)
  test = (tmp_path / "test.txt").read_text().splitlines()
  train = (tmp_path / "train.txt").read_text().splitlines()
  assert test == ["Pierre/NNP Vinken/NNP will/MD join/VB ./.", "He/PRP agreed/VBD ./.",
                  "Line/NN 10/CD ./."]
  assert train[:3] == ["The/DT board/NN met/VBD ./.", "Prices/NNS rose/VBD 3/CD %/NN ./.",
                       "No/DT period/NN"]
  assert len(train) == 1 + 2 + 8


def test_wsj_pos_prepares_as_tagged_tokens_with_a_test_split(tmp_path):
  fetch.write_wsj_pos(WSJ, tmp_path / "raw")
  kind, options = builders.FETCHED["wsj_pos"]
  name = builders.prepare(kind, tmp_path / "raw", tmp_path / "tfds", name="wsj_pos", **options)
  test = sources.open_source(name, "test", tmp_path / "tfds")
  assert len(test) == 3
  assert "NNP" in sources.label_names(name, tmp_path / "tfds", feature="tags")


def _lazyload_db(path, frames: dict):
  """An R lazy-load DB (path.rdx + path.rdb) holding `frames`, as R writes it (LZMA2)."""
  import rdata
  blob, index = b"", {}
  for name, frame in frames.items():
    rds = path.with_name(f"{name}.rds")
    rdata.write_rds(rds, frame, compression=None)
    raw = rds.read_bytes()
    packed = lzma.compress(raw, format=lzma.FORMAT_RAW, filters=[{"id": lzma.FILTER_LZMA2}])
    chunk = struct.pack(">i", len(raw)) + b"Z" + packed
    index[name] = np.array([len(blob), len(chunk)], np.int32)
    blob += chunk
  path.with_suffix(".rdb").write_bytes(blob)
  rdata.write_rds(path.with_suffix(".rdx"), {"variables": index}, compression="gzip")


def test_fine_foods_reads_an_r_lazyload_db_into_a_text_classification_set(tmp_path):
  # Named lists of character vectors: rdata cannot write pandas 3's string columns, and
  # the reader only indexes columns by name, as it does a data.frame's.
  frames = {
      "training_data": {"review": np.array(["Tasty, \"crunchy\"<br />snack", "Stale."]),
                        "score": np.array(["great", "other"])},
      "testing_data": {"review": np.array(["Fine\nfood"]), "score": np.array(["great"])}}
  _lazyload_db(tmp_path / "Rdata", frames)
  read = fetch.read_lazyload(tmp_path / "Rdata", ("training_data", "testing_data"))
  rows = {split: list(zip(read[name]["review"], read[name]["score"]))
          for split, name in (("train", "training_data"), ("test", "testing_data"))}
  fetch.write_fine_foods(rows, tmp_path / "raw")
  kind, options = builders.FETCHED["fine_foods"]
  name = builders.prepare(kind, tmp_path / "raw", tmp_path / "tfds", name="ff", **options)
  train = [sources.open_source(name, "train", tmp_path / "tfds")[i] for i in range(2)]
  texts = sorted(ex["text"].decode() for ex in train)
  assert texts == ["Stale.", 'Tasty, "crunchy" snack']
  assert sources.label_names(name, tmp_path / "tfds") == ["great", "other"]
  test = sources.open_source(name, "test", tmp_path / "tfds")
  assert len(test) == 1 and test[0]["text"].decode() == "Fine food"


def _hf_dir(path, seed: int):
  """A tiny BERT saved as a Hugging Face directory; its Encoder params."""
  cfg = tiny_config()
  params = Encoder(cfg).init(jax.random.key(seed), np.ones((1, 8), np.int32))["params"]
  save(path, cfg, params)
  return cfg, jax.device_get(nn.meta.unbox(params))


def test_init_from_a_hugging_face_dir_converts_it_once_into_data_dir(tmp_path):
  cfg, params = _hf_dir(tmp_path / "hf", seed=0)
  config = base_config()
  config.init_from, config.data.data_dir = str(tmp_path / "hf"), str(tmp_path / "data")
  with pytest.raises(ValueError, match="no tokenizer files"):  # none came along: no default
    adopt(config)
  config.init_from = str(tmp_path / "hf")
  config.data.tokenizer = str(tmp_path / "vocab.txt")  # named: taken as given
  changes = adopt(config)
  assert config.init_from.startswith(str(tmp_path / "data" / "pretrained" / "hf-"))
  assert f"init_from: {tmp_path / 'hf'} -> {config.init_from}" in changes
  assert (config.model.num_layers, config.model.emb_dim) == (cfg.num_layers, cfg.emb_dim)
  run = RunDir.open(config.init_from)
  chex.assert_trees_all_close(jax.device_get(stored_encoder(run)), params)
  stamp = os.stat(run.path / CONVERTED_FROM).st_mtime_ns
  assert pretrained_run_dir(str(tmp_path / "hf"), tmp_path / "data") == config.init_from
  assert os.stat(run.path / CONVERTED_FROM).st_mtime_ns == stamp  # cached: not reconverted


def test_init_from_a_changed_hugging_face_dir_is_converted_again(tmp_path):
  _hf_dir(tmp_path / "hf", seed=0)
  first = pretrained_run_dir(str(tmp_path / "hf"), tmp_path / "data")
  _, params = _hf_dir(tmp_path / "hf", seed=1)
  assert pretrained_run_dir(str(tmp_path / "hf"), tmp_path / "data") == first
  chex.assert_trees_all_close(jax.device_get(stored_encoder(RunDir.open(first))), params)


def test_init_from_a_run_dir_is_left_as_is(tmp_path):
  assert pretrained_run_dir(str(tmp_path / "run"), tmp_path / "data") == str(tmp_path / "run")


@pytest.mark.slow
def test_fine_tuning_from_a_hugging_face_dir_starts_from_its_encoder(tmp_path):
  """A 1-step run with a frozen encoder: the run's encoder is the file's, exactly."""
  import train_helpers as th
  from jaxencoder.train.loop import train_and_evaluate
  _, params = _hf_dir(tmp_path / "hf", seed=0)
  vocab = th.write_vocab(tmp_path)
  config = th.tiny_config(tmp_path, th.tagged_set(tmp_path), vocab)
  config.task, config.data.kind = "token_classify", "tagged_tokens"
  config.init_from, config.optim.freeze_encoder = str(tmp_path / "hf"), True
  config.num_train_steps = config.eval_every = config.checkpoint_every = 1
  train_and_evaluate(config, tmp_path / "run")
  chex.assert_trees_all_equal(jax.device_get(stored_encoder(RunDir.open(tmp_path / "run"))),
                              params)


@pytest.mark.usefixtures("minilm")
def test_init_from_minilm_names_the_wheels_model(tmp_path):
  config = base_config()
  config.init_from, config.data.data_dir = "minilm", str(tmp_path)
  config.data.kind = "text_classification"
  adopt(config)
  assert config.init_from == str(tmp_path / "pretrained" / "minilm")
  assert (config.model.num_layers, config.model.emb_dim, config.model.pooling) == (6, 384, "mean")
  assert config.data.tokenizer == config.init_from  # the converted dir holds the vocab
  stamp = json.loads((tmp_path / "pretrained" / "minilm" / CONVERTED_FROM).read_text())
  assert stamp["source"] == str(default_tokenizer_path())
