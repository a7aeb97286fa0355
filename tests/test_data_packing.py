import numpy as np
import pytest

from jaxencoder.data import packing

KEYS = ("input_ids", "token_type_ids")


def _examples(n, seed=0, max_len=20):
  rng = np.random.default_rng(seed)
  return [{"input_ids": rng.integers(5, 99, rng.integers(1, max_len + 1)).astype(np.int32),
           "token_type_ids": np.zeros(0, np.int32)} for _ in range(n)]


def _fix_types(exs):
  for ex in exs:
    ex["token_type_ids"] = np.zeros_like(ex["input_ids"])
  return exs


def _packed_rows(exs, length, chunk):
  """pack_rows over consecutive chunks of `chunk` examples, as the MLM pipeline packs."""
  rows = []
  for start in range(0, len(exs), chunk):
    part = exs[start:start + chunk]
    lengths = np.array([len(e["input_ids"]) for e in part])
    arrays = {k: np.stack([np.pad(e[k], (0, length - len(e[k]))) for e in part]) for k in KEYS}
    packed = packing.pack_rows(arrays, lengths, length)
    rows += [{k: v[r] for k, v in packed.items()} for r in range(len(packed["input_ids"]))]
  return rows


def test_packing_keeps_every_token_once_with_segments_and_positions():
  exs = _fix_types(_examples(200))
  rows = _packed_rows(exs, 32, 32)
  recovered = []
  for row in rows:
    seg, pos, ids = row["segment_ids"], row["positions"], row["input_ids"]
    assert seg.shape == (32,)
    np.testing.assert_array_equal(row["attention_mask"], seg > 0)
    real = seg[seg > 0]
    assert (np.diff(real) >= 0).all() and real[0] == 1
    assert set(real) == set(range(1, real.max() + 1))
    assert (seg[len(real):] == 0).all()  # padding only at the end
    for s in range(1, seg.max() + 1):
      assert (pos[seg == s] == np.arange((seg == s).sum())).all()
      recovered.append(tuple(ids[seg == s]))
  assert sorted(recovered) == sorted(tuple(e["input_ids"]) for e in exs)


def test_packing_beats_padding_on_efficiency():
  exs = _fix_types(_examples(300, seed=1))
  packed = np.stack([r["attention_mask"] for r in _packed_rows(exs, 32, 64)])
  padded = np.stack([packing.pad_example(e, 32, KEYS)["attention_mask"] for e in exs])
  assert packed.sum() == padded.sum()
  assert packing.padding_efficiency(packed) > 0.9 > 0.5 > packing.padding_efficiency(padded)


def test_pad_example_sets_mask_segments_and_positions():
  ex = {"input_ids": np.array([2, 7, 3], np.int32), "token_type_ids": np.zeros(3, np.int32)}
  out = packing.pad_example(ex, 5, KEYS, pad_id=0)
  assert out["input_ids"].tolist() == [2, 7, 3, 0, 0]
  assert out["attention_mask"].tolist() == out["segment_ids"].tolist() == [1, 1, 1, 0, 0]
  assert out["positions"].tolist() == [0, 1, 2, 0, 0]


def test_first_fit_decreasing_places_the_longest_first_and_fills_gaps():
  row_N, offset_N, rows = packing.first_fit(np.array([3, 6, 4, 2, 1]), 8)
  # 6 -> row 0 [0, 6); 4 -> row 1 [0, 4); 3 -> row 1 [4, 7); 2 -> row 0 [6, 8); 1 -> row 1 [7, 8)
  assert rows == 2
  assert row_N.tolist() == [1, 0, 1, 0, 1] and offset_N.tolist() == [4, 0, 0, 6, 7]


def test_a_sequence_longer_than_the_row_is_an_error():
  with pytest.raises(ValueError, match="9 tokens does not fit length 8"):
    packing.first_fit(np.array([3, 9]), 8)
