"""From scratch, the model's vocabulary follows the tokenizer unless the user set it."""

import logging
from types import SimpleNamespace

import jax
import pytest

import train_helpers as th
from data_helpers import VOCAB
from jaxencoder.tokenizer import Tokenizer
from jaxencoder.train import loop, steps
from jaxencoder.train.config import apply_overrides, base_config, override_model
from jaxencoder.train.datasets import make_pipelines, vocab_from_tokenizer
from jaxencoder.train.init_from import finalized

TOKENS = 2000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """A corpus and a 2,000-token vocab (the tiny vocab and fillers)."""
  root = tmp_path_factory.mktemp("vocab")
  vocab = root / "vocab2000.txt"
  vocab.write_text("\n".join(VOCAB + [f"filler{i}" for i in range(TOKENS - len(VOCAB))]) + "\n")
  return root, th.text_corpus(root, docs=40), vocab


def scratch_config(data):
  """The tiny MLM config with the base config's (unset) vocab_size."""
  root, source, vocab = data
  return th.tiny_config(root, source, vocab, vocab_size=base_config().model.vocab_size)


def embedding_rows(config) -> int:
  """Rows of the token embedding table of the model a run of `config` builds."""
  pipelines = make_pipelines(config)
  task = loop.build_task(config, pipelines)
  shapes = steps.param_shapes(task, loop.peek(iter(pipelines.train)))
  (rows,) = {leaf.shape[0] for path, leaf in jax.tree_util.tree_leaves_with_path(shapes)
             if "token_embed" in jax.tree_util.keystr(path)}
  return rows


def messages(caplog) -> list[str]:
  return [r.getMessage() for r in caplog.records if "vocab_size" in r.getMessage()]


def test_an_unset_vocab_size_becomes_the_tokenizers(data, caplog):
  with caplog.at_level(logging.INFO, logger="jaxencoder"):
    config = finalized(scratch_config(data))
  assert config.model.vocab_size == TOKENS
  assert messages(caplog) == ["model.vocab_size = 2000, the tokenizer's size"]
  assert embedding_rows(config) == TOKENS


def test_a_larger_table_set_by_the_user_is_kept_with_a_note(data, caplog):
  config = scratch_config(data)
  override_model(config, vocab_size=TOKENS + 48)
  with caplog.at_level(logging.INFO, logger="jaxencoder"):
    config = finalized(config)
  assert config.model.vocab_size == TOKENS + 48
  assert messages(caplog) == ["model.vocab_size=2048 is larger than the tokenizer's 2000 "
                              "tokens: 48 rows of the embedding table are never read"]


def test_a_smaller_table_set_by_the_user_is_an_error_naming_both_sizes(data):
  config = scratch_config(data)
  apply_overrides(config, ["model.vocab_size=1000"])
  config = finalized(config)
  assert config.model.vocab_size == 1000
  tokenizer = Tokenizer.from_file(str(data[2]))
  with pytest.raises(ValueError, match=r"the tokenizer has 2000 tokens but the model's "
                     r"embedding table has 1000 rows \(model.vocab_size\)"):
    loop.build_task(config, SimpleNamespace(tokenizer=tokenizer, num_classes=None))


def test_the_default_minilm_vocab_leaves_the_default_size():
  config = base_config()
  vocab_from_tokenizer(config)
  assert config.model.vocab_size == 30522


def test_init_from_keeps_the_checkpoints_table(data, caplog):
  config = scratch_config(data)
  config.init_from = "some/run"
  with caplog.at_level(logging.INFO, logger="jaxencoder"):
    vocab_from_tokenizer(config)
  assert config.model.vocab_size == 30522 and not messages(caplog)
