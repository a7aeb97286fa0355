"""Seq2seq rows from plain text (data/shuffled_words.py): the encoder gets a permutation of
the decoder's words, the decoder its targets shifted right."""

import collections

import numpy as np

from data_helpers import sentences, tiny_tokenizer
from jaxencoder.data import shuffled_words
from jaxencoder.data.pipeline import Reading


def rows(n: int = 40, seed: int = 0, **kw):
  source = sentences(n)
  ds = shuffled_words.shuffled_words_pipeline(
      source, tiny_tokenizer(), seq_len=16, batch_size=n,
      read=Reading(seed=seed, shard_index=0, shard_count=1), **kw)
  return next(iter(ds)), source


def test_source_words_are_a_permutation_of_the_target_words():
  batch, _ = rows()
  tok = tiny_tokenizer()
  real = batch["target_weights"] > 0
  assert real.any(axis=1).sum() > 30
  for i in np.flatnonzero(real.any(axis=1)):
    source = batch["input_ids"][i][batch["attention_mask"][i] > 0][1:-1]  # no [CLS] [SEP]
    target = batch["target_ids"][i][real[i]]
    assert target[-1] == tok.sep_id  # the end token
    assert collections.Counter(source.tolist()) == collections.Counter(target[:-1].tolist())


def test_decoder_inputs_are_the_targets_shifted_right_after_cls():
  batch, _ = rows()
  tok = tiny_tokenizer()
  mask = batch["decoder_mask"] > 0
  assert (batch["decoder_input_ids"][:, 0] == tok.cls_id).all()
  for i in range(len(mask)):
    n = mask[i].sum()
    np.testing.assert_array_equal(batch["decoder_input_ids"][i, 1:n],
                                  batch["target_ids"][i, :n - 1])


def test_sentences_keep_to_the_word_limits_and_short_texts_weigh_nothing():
  batch, source = rows(min_words=3, max_words=5)
  real = batch["target_weights"] > 0
  words = real.sum(axis=1)[real.any(axis=1)] - 1  # the tiny vocab: a token per word, + [SEP]
  assert words.min() >= 3 and words.max() <= 5
  lengths = np.array([len(ex["text"].split()) for ex in source])
  assert (~real.any(axis=1)).sum() == (lengths < 3).sum() > 0


def test_the_same_seed_gives_the_same_rows_and_another_seed_other_orders():
  a, _ = rows(seed=1)
  b, _ = rows(seed=1)
  c, _ = rows(seed=2)
  for key in a:
    np.testing.assert_array_equal(a[key], b[key])
  assert not np.array_equal(a["input_ids"], c["input_ids"])
