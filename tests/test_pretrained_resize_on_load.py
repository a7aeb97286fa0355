"""Position tables resized at load, opt-in: pretrained.load(max_len=, image_size=) and the
convert CLI's --max_len / --image_size (jaxencoder.pretrained.hf_checkpoint.resize_on_load)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from data_helpers import VOCAB, tiny_tokenizer
from jaxencoder import Encoder
from jaxencoder.io.run_dir import RunDir
from jaxencoder.model.restore_targets import stored_config
from jaxencoder.model.positions import resample_position_table
from jaxencoder.pretrained import load, save
from jaxencoder.pretrained.__main__ import main as convert_main
from jaxencoder.pretrained.hf_checkpoint import resize_on_load
from test_pretrained_vit import init_params, tiny_vit

TABLE = ("embeddings", "position_embed", "embedding")


def table(params):
  return np.asarray(params[TABLE[0]][TABLE[1]][TABLE[2]])


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
  """A tiny random BERT directory with a 64-row position table."""
  path = tmp_path_factory.mktemp("bert")
  cfg = tiny_config(vocab_size=len(VOCAB), max_len=64)
  save(path, cfg, init_params(cfg), tiny_tokenizer())
  return path


def run_text(cfg, params, length: int):
  ids_BxL = jnp.ones((1, length), jnp.int32)
  return Encoder(cfg).apply({"params": params}, ids_BxL).last_hidden_state


def test_without_max_len_a_longer_input_is_an_error_naming_the_table(bert_dir):
  cfg, params, _ = load(bert_dir)
  assert cfg.max_len == 64 and table(params).shape[0] == 64
  with pytest.raises(ValueError, match=r"sequence length 100 is longer than the position "
                                       r"table \(max_len=64"):
    run_text(cfg, params, 100)


def test_max_len_extends_the_table_by_interpolation_and_warns(bert_dir, caplog):
  old = table(load(bert_dir)[1])
  with caplog.at_level(logging.WARNING):
    cfg, params, _ = load(bert_dir, max_len=128)
  assert cfg.max_len == 128 and table(params).shape == (128, old.shape[1])
  np.testing.assert_allclose(table(params), resample_position_table(old, 128, "linear"))
  assert "position table resized by interpolation from 64 to 128 rows" in caplog.text
  assert run_text(cfg, params, 100).shape == (1, 100, cfg.emb_dim)


def test_max_len_within_the_table_changes_nothing(bert_dir, caplog):
  cfg, params, _ = load(bert_dir)
  with caplog.at_level(logging.WARNING):
    same_cfg, same, _ = load(bert_dir, max_len=32)
  assert same_cfg == cfg and not caplog.text
  np.testing.assert_array_equal(table(same), table(params))


def test_max_len_without_a_table_raises_max_len_and_warns(caplog):
  cfg = tiny_config(position_embedding="rope", max_len=64)
  with caplog.at_level(logging.WARNING):
    new_cfg, params = resize_on_load(cfg, {"untouched": 1}, max_len=256)
  assert new_cfg.max_len == 256 and params == {"untouched": 1}
  assert "rope positions have no table to resize" in caplog.text


def test_sizes_of_the_wrong_kind_are_refused(bert_dir, tmp_path):
  with pytest.raises(ValueError, match="resizes image encoders"):
    load(bert_dir, image_size=(16, 16))
  cfg = tiny_vit()
  save(tmp_path, cfg, init_params(cfg))
  with pytest.raises(ValueError, match="max_len=128 sets the text length"):
    load(tmp_path, max_len=128)


def test_image_size_resamples_a_vit_grid_at_load(tmp_path, caplog):
  cfg = tiny_vit()
  save(tmp_path, cfg, init_params(cfg))
  with caplog.at_level(logging.WARNING):
    new_cfg, params, _ = load(tmp_path, image_size=(48, 48))
  assert new_cfg.image_size == (48, 48) and table(params).shape == (1 + 36, cfg.emb_dim)
  assert "image_size (32, 32) -> (48, 48)" in caplog.text
  images_BxHxWxC = jnp.zeros((1, 48, 48, 3))
  out = jax.jit(Encoder(new_cfg).apply)({"params": params}, images_BxHxWxC)
  assert out.last_hidden_state.shape == (1, 37, cfg.emb_dim)


def test_convert_cli_resizes_on_the_way_in_only(bert_dir, tmp_path, capsys):
  convert_main(["--from", str(bert_dir), "--to", str(tmp_path / "run"), "--max_len", "96"])
  cfg = stored_config(RunDir.open(tmp_path / "run"))
  assert cfg.max_len == 96
  with pytest.raises(SystemExit):
    convert_main(["--from", str(tmp_path / "run"), "--to", str(tmp_path / "hf"),
                  "--max_len", "128"])
  assert "SRC must be a Hugging Face directory" in capsys.readouterr().err
