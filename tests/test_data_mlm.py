import numpy as np
import pytest

from jaxencoder.data import mlm

SPECIALS = (0, 1, 2, 3, 4)
SPEC = mlm.MaskSpec(vocab_size=100, mask_id=4, special_ids=SPECIALS)


def _sequences(n, seed=0):
  """n rows of [CLS] tokens [SEP] [PAD]... with token ids in [5, 100)."""
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(n):
    k = rng.integers(5, 60)
    rows.append(np.concatenate([[2], rng.integers(5, 100, k), [3], np.zeros(64 - k - 2)])
                .astype(np.int32))
  return rows


def test_mask_rates_match_bert_80_10_10():
  rng = np.random.default_rng(0)
  chosen = masked = randomised = kept = candidates = 0
  for ids in _sequences(2000):
    out = mlm.mask_tokens(ids, SPEC, rng)
    sel = out["mlm_weights"] > 0
    candidates += int((ids >= 5).sum())
    chosen += int(sel.sum())
    masked += int((out["input_ids"][sel] == 4).sum())
    kept += int((out["input_ids"][sel] == ids[sel]).sum())
    randomised += int((sel & (out["input_ids"] != ids) & (out["input_ids"] != 4)).sum())
    np.testing.assert_array_equal(out["mlm_labels"], ids)
  assert chosen / candidates == pytest.approx(0.15, abs=0.005)
  assert masked / chosen == pytest.approx(0.8, abs=0.02)
  # A random draw can hit the original id (1 in 95): "kept" includes those.
  assert (randomised + kept) / chosen == pytest.approx(0.2, abs=0.02)
  assert randomised / chosen == pytest.approx(0.1 * 94 / 95, abs=0.015)


def test_never_masks_specials_or_padding():
  rng = np.random.default_rng(1)
  for ids in _sequences(500):
    out = mlm.mask_tokens(ids, SPEC, rng)
    special = np.isin(ids, SPECIALS)
    assert not out["mlm_weights"][special].any()
    np.testing.assert_array_equal(out["input_ids"][special], ids[special])
    assert not np.isin(out["input_ids"][~special], SPECIALS[:4]).any()  # random never special


def test_whole_word_masking_takes_all_subwords_of_a_word():
  ids = np.array([2, 10, 11, 12, 20, 21, 30, 3, 0, 0], np.int32)
  words = np.array([-1, 0, 0, 0, 1, 1, 2, -1, -1, -1])
  spec = mlm.MaskSpec(vocab_size=100, mask_id=4, special_ids=SPECIALS, rate=0.3,
                      whole_word=True)
  for seed in range(50):
    out = mlm.mask_tokens(ids, spec, np.random.default_rng(seed), words)
    picked_words = set(words[out["mlm_weights"] > 0])
    for w in range(3):
      members = out["mlm_weights"][words == w]
      assert members.all() if w in picked_words else not members.any()


def test_same_rng_seed_same_mask():
  ids = _sequences(1)[0]
  a = mlm.mask_tokens(ids, SPEC, np.random.default_rng(7))
  b = mlm.mask_tokens(ids, SPEC, np.random.default_rng(7))
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])
