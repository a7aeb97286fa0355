import numpy as np
import pytest

from data_helpers import sentences, tiny_tokenizer
from jaxencoder.data import pipeline
from jaxencoder.data.pipeline import Reading
from jaxencoder.data.readers import DataError

SEQ = 16


def _mlm(source, *, mode="pad", batch_size=4, **reading):
  """MLM batches of SEQ tokens; `reading`: Reading's fields over seed 3, one shard."""
  read = Reading(**{**dict(seed=3, shard_index=0, shard_count=1), **reading})
  return pipeline.mlm_pipeline(source, tiny_tokenizer(), seq_len=SEQ, batch_size=batch_size,
                               mode=mode, read=read)


@pytest.mark.parametrize("mode", ["pad", "pack", "best_fit"])
def test_mlm_batches_have_static_shapes_and_documented_keys(mode):
  batches = list(_mlm(sentences(37), mode=mode))
  keys = {"input_ids", "token_type_ids", "attention_mask", "segment_ids", "positions",
          "mlm_labels", "mlm_weights"}
  for b in batches:
    assert set(b) == keys
    assert all(v.shape == (4, SEQ) for v in b.values())
    assert not b["mlm_weights"][b["attention_mask"] == 0].any()
  real = sum(int(b["attention_mask"].sum()) for b in batches)
  lengths = tiny_tokenizer().encode_batch([s["text"].decode() for s in sentences(37)])
  assert real == int(lengths["attention_mask"].sum())  # nothing dropped, nothing duplicated


def _origins(reading, source):
  out = []
  for b in pipeline.classification_pipeline(source, tiny_tokenizer(), seq_len=SEQ,
                                            batch_size=5, read=Reading(**reading)):
    out += b["labels"][b["example_weights"] > 0].tolist()
  return out


def test_shards_are_disjoint_and_complete():
  source = [{"text": b"the cat", "text_b": b"", "label": i} for i in range(23)]
  shards = [_origins(dict(seed=1, shard_index=i, shard_count=3), source) for i in range(3)]
  flat = [x for s in shards for x in s]
  assert sorted(flat) == list(range(23))
  assert all(set(a).isdisjoint(b) for i, a in enumerate(shards) for b in shards[i + 1:])


def test_shuffle_is_deterministic_by_seed():
  source = [{"text": b"dog", "text_b": b"", "label": i} for i in range(30)]
  a = _origins(dict(seed=5, shard_index=0, shard_count=1), source)
  assert a == _origins(dict(seed=5, shard_index=0, shard_count=1), source)
  assert a != _origins(dict(seed=6, shard_index=0, shard_count=1), source)
  assert a != list(range(30))


@pytest.mark.parametrize("mode", ["pad", "pack", "best_fit"])
def test_checkpointed_iterator_resumes_with_identical_batches(mode):
  ds = _mlm(sentences(60), mode=mode, num_epochs=None)
  it = iter(ds)
  for _ in range(3):
    next(it)
  state = it.get_state()
  expected = [next(it) for _ in range(4)]
  resumed = iter(ds)
  resumed.set_state(state)
  for want in expected:
    got = next(resumed)
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])


def test_epochs_reshuffle_and_remask():
  ds = _mlm(sentences(8), mode="pad", num_epochs=2, batch_size=8)
  first, second = list(ds)
  assert sorted(map(tuple, first["mlm_labels"])) == sorted(map(tuple, second["mlm_labels"]))
  assert not np.array_equal(first["mlm_weights"], second["mlm_weights"])


def test_zero_length_text_raises_with_origin():
  source = [{"text": b"   ", "origin": b"corpus.txt:7"}]
  with pytest.raises(DataError, match="corpus.txt:7: zero-length sequence"):
    list(_mlm(source))


def test_tagging_labels_sit_on_first_subwords():
  tok = tiny_tokenizer()
  source = [{"words": [b"cats", b"sat", b"flies"], "tags": np.array([1, 2, 3])}]
  (b,) = list(pipeline.tagging_pipeline(source, tok, seq_len=10, batch_size=1,
                                        read=Reading(seed=None, shard_index=0, shard_count=1)))
  pieces = [tok.hf.id_to_token(int(i)) for i in b["input_ids"][0][:7]]
  assert pieces == ["[CLS]", "cat", "##s", "sat", "flies", "[SEP]", "[PAD]"]
  assert b["label_weights"][0].tolist()[:5] == [0, 1, 0, 1, 1]
  assert b["labels"][0].tolist()[:5] == [0, 1, 0, 2, 3]
  assert b["label_weights"][0][5:].sum() == 0


def test_image_pipeline_normalises_to_float_hwc():
  source = [{"image": np.full((2, 3), v, np.uint8), "label": i}
            for i, v in enumerate([0, 255, 51])]
  (b,) = list(pipeline.image_pipeline(source, batch_size=4,
                                      read=Reading(seed=None, shard_index=0, shard_count=1)))
  assert b["images"].shape == (4, 2, 3, 1) and b["images"].dtype == np.float32
  assert b["images"][:3, 0, 0, 0].tolist() == pytest.approx([-1.0, 1.0, -0.6])
  assert b["example_weights"].tolist() == [1, 1, 1, 0]


def test_series_pipeline_pads_with_mask_and_rejects_too_long():
  source = [{"series": np.ones((3, 2), np.float32), "label": 1, "origin": b"a.ts:9"}]
  (b,) = list(pipeline.series_pipeline(source, length=5, batch_size=1,
                                       read=Reading(seed=None, shard_index=0, shard_count=1)))
  assert b["inputs"].shape == (1, 5, 2) and b["attention_mask"].tolist() == [[1, 1, 1, 0, 0]]
  with pytest.raises(DataError, match=r"a.ts:9: series of 3 steps > length=2"):
    list(pipeline.series_pipeline(source, length=2, batch_size=1,
                                  read=Reading(shard_index=0, shard_count=1)))


def test_process_shards_hold_their_rows_of_the_same_global_batches():
  """2 processes x 3 rows see exactly the rows of 1 process x 6, MLM masks included."""
  source = sentences(41)
  whole = list(_mlm(source, batch_size=6))
  parts = [list(_mlm(source, batch_size=3, shard_index=p, shard_count=2)) for p in range(2)]
  assert len(parts[0]) == len(parts[1]) == len(whole) == 7  # the last one partly filled
  for k, batch in enumerate(whole):
    for key, value in batch.items():
      np.testing.assert_array_equal(np.concatenate([parts[0][k][key], parts[1][k][key]]), value)
