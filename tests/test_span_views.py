"""Contrastive views `halves`: a text's first half is the positive of its second."""

import numpy as np
import pytest

from data_helpers import VOCAB, WORDS, tiny_tokenizer
from jaxencoder.data import builders, pipeline, sources, span_views
from jaxencoder.data.pipeline import Reading
from jaxencoder.data.readers import as_text


def test_the_cut_falls_on_the_word_boundary_nearest_the_middle():
  assert span_views.split_point(np.array([0, 1, 2, 3])) == 2
  assert span_views.split_point(np.array([0, 1, 1, 1, 2])) == 1  # token 2 is inside word 1
  assert span_views.split_point(np.array([0, 0, 0, 0])) == 2  # one word: cut in it
  assert span_views.split_point(np.array([5])) == 0


def _source(tmp_path, tokenizer_file=None):
  rng = np.random.default_rng(0)
  src = tmp_path / "corpus"
  src.mkdir()
  texts = [" ".join(rng.choice(WORDS, size=rng.integers(1, 25))) for _ in range(40)]
  (src / "a.txt").write_text("\n\n".join(texts) + "\n")
  out = builders.prepare("text_corpus", src, tmp_path / "tfds", name="c", tokenizer=tokenizer_file)
  return sources.open_source(str(out)), texts


def _rows(source, tok, seq_len):
  """(input_ids, attention_mask) [2, L] of every text, in source order."""
  batches = span_views.halves_pipeline(source, tok, seq_len=seq_len, batch_size=8,
                                       read=Reading(seed=None, shard_index=0, shard_count=1))
  return [(b["input_ids"][r], b["attention_mask"][r]) for b in batches for r in range(8)
          if b["example_weights"][r]]


def _views(ids_2xL, mask_2xL, tok):
  views = [ids_2xL[v][mask_2xL[v] > 0] for v in range(2)]
  for view in views:
    assert view[0] == tok.cls_id and view[-1] == tok.sep_id
  assert (ids_2xL[mask_2xL == 0] == tok.pad_id).all()
  return [view[1:-1] for view in views]


@pytest.mark.parametrize("stored", [False, True])
def test_halves_are_the_two_parts_of_each_text(tmp_path, stored):
  tok = tiny_tokenizer()
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(VOCAB) + "\n")
  source, _ = _source(tmp_path, vocab if stored else None)
  texts = [as_text(ex["text"]) for ex in pipeline.read_examples(source, range(len(source)))]
  long_rows, short_rows = _rows(source, tok, 64), _rows(source, tok, 8)
  assert len(long_rows) == len(short_rows) == len(texts) == 40
  for text, long_row, short_row in zip(texts, long_rows, short_rows):
    enc = tok.encode(text)
    full, words = enc["input_ids"][1:-1], enc["word_ids"][1:-1]
    a, b = _views(*long_row, tok)
    if len(full) < 2:  # one token: the same span twice
      np.testing.assert_array_equal(a, full)
      np.testing.assert_array_equal(b, full)
    else:  # no truncation at 64: the halves rejoin into the text, cut at a word start
      np.testing.assert_array_equal(np.concatenate([a, b]), full)
      assert len(a) == span_views.split_point(np.asarray(words))
    # at seq_len 8: the halves of the text's first 2 x 8 - 2 tokens, each cut to 6
    head, head_words = full[:14], np.asarray(words[:14])
    cut = span_views.split_point(head_words) or len(head)
    short_a, short_b = _views(*short_row, tok)
    np.testing.assert_array_equal(short_a, head[:cut][:6])
    np.testing.assert_array_equal(short_b, (head[cut:] if len(head) > 1 else head)[:6])


def test_views_follow_the_shard_not_the_process_count(tmp_path):
  source, _ = _source(tmp_path)
  tok = tiny_tokenizer()
  def rows(**shard):
    out = []
    for b in span_views.halves_pipeline(source, tok, seq_len=10, batch_size=4,
                                        read=Reading(seed=1, **shard)):
      out += [tuple(b["input_ids"][r].ravel()) for r in range(4) if b["example_weights"][r]]
    return out
  whole = rows(shard_index=0, shard_count=1)
  split = rows(shard_index=0, shard_count=2) + rows(shard_index=1, shard_count=2)
  assert sorted(whole) == sorted(split) and len(whole) == 40
