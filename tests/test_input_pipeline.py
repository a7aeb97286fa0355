"""The fast input path: token ids stored at prepare, masks drawn per example from a
counter, whole batches per worker, and device prefetch that checkpoints exactly."""

import json
import pathlib
import time

import numpy as np
import pytest

from data_helpers import VOCAB, WORDS, tiny_tokenizer
from jaxencoder.data import builders, mlm, pipeline, sources, token_ids
from jaxencoder.data.pipeline import Reading
from jaxencoder.data.readers import DataError
from jaxencoder.data.splits import Subset
from jaxencoder.tokenizer import Tokenizer
from jaxencoder.train.prefetch import DevicePrefetch

SPEC = mlm.MaskSpec(vocab_size=len(VOCAB), mask_id=4, special_ids=(0, 1, 2, 3, 4))


def _corpus(tmp_path: pathlib.Path, n: int = 120, seed: int = 0) -> pathlib.Path:
  """A text_corpus source: paragraphs of 1..30 vocab words (some longer than seq_len)."""
  rng = np.random.default_rng(seed)
  src = tmp_path / "corpus"
  src.mkdir(exist_ok=True)
  paragraphs = [" ".join(rng.choice(WORDS, size=rng.integers(1, 31))) for _ in range(n)]
  (src / "a.txt").write_text("\n\n".join(paragraphs[: n // 2]) + "\n")
  (src / "b.txt").write_text("\n\n".join(paragraphs[n // 2:]) + "\n")
  return src


def _vocab_file(tmp_path: pathlib.Path, vocab=VOCAB) -> str:
  path = tmp_path / f"vocab{len(vocab)}.txt"
  path.write_text("\n".join(vocab) + "\n")
  return str(path)


def _prepared(tmp_path, tokenizer_file=None):
  out = builders.prepare("text_corpus", _corpus(tmp_path), tmp_path / "tfds", name="c",
                         tokenizer=tokenizer_file)
  return sources.open_source(str(out))


# ------------------------------------------------------------------ masking
def test_counter_draws_depend_only_on_the_example_and_position():
  both = mlm.counter_uniforms(7, np.array([3, 11]), 16)
  one = mlm.counter_uniforms(7, np.array([11]), 16)
  for stream in range(3):
    np.testing.assert_array_equal(both(stream)[1], one(stream)[0])
    assert not np.array_equal(both(stream)[0], both(stream)[1])
  assert not np.array_equal(both(0), mlm.counter_uniforms(8, np.array([3, 11]), 16)(0))
  draws = mlm.counter_uniforms(0, np.arange(2000), 64)(0)
  assert 0 <= draws.min() and draws.max() < 1
  assert draws.mean() == pytest.approx(0.5, abs=0.003)  # 128k draws: sd of mean ~0.0008


def test_batch_masking_keeps_bert_rates_and_never_touches_specials():
  rng = np.random.default_rng(0)
  lengths = rng.integers(3, 60, 2000)
  ids = np.zeros((2000, 64), np.int32)
  for i, n in enumerate(lengths):
    ids[i, :n] = np.concatenate([[2], rng.integers(5, len(VOCAB), n - 2), [3]])
  out = mlm.mask_batch(ids, SPEC, mlm.counter_uniforms(1, np.arange(2000), 64))
  chosen = out["mlm_weights"] > 0
  n_real = (ids >= 5).sum(axis=1)
  np.testing.assert_array_equal(chosen.sum(axis=1), np.maximum(np.round(0.15 * n_real), 1))
  assert not chosen[ids < 5].any()
  np.testing.assert_array_equal(out["input_ids"][ids < 5], ids[ids < 5])
  masked = (out["input_ids"][chosen] == 4).mean()
  assert masked == pytest.approx(0.8, abs=0.02)
  assert not np.isin(out["input_ids"][~(ids < 5)], [0, 1, 2, 3]).any()


def test_whole_word_batch_masking_takes_every_subword_of_a_chosen_word():
  ids = np.array([[2, 10, 11, 12, 20, 21, 30, 3, 0, 0]] * 50, np.int32)
  words = np.array([[-1, 0, 0, 0, 1, 1, 2, -1, -1, -1]] * 50)
  spec = mlm.MaskSpec(vocab_size=100, mask_id=4, special_ids=(0, 1, 2, 3, 4), rate=0.3,
                      whole_word=True)
  out = mlm.mask_batch(ids, spec, mlm.counter_uniforms(0, np.arange(50), 10), words)
  for row, weights in zip(words, out["mlm_weights"]):
    for w in range(3):
      members = weights[row == w]
      assert members.all() or not members.any()
    assert weights.sum() >= 2  # round(0.3 * 6): whole words until at least 2 tokens


# ------------------------------------------------------------------ stored ids
def test_stored_ids_equal_the_tokenizers_own_truncation(tmp_path):
  source = _prepared(tmp_path, _vocab_file(tmp_path))
  tok = tiny_tokenizer()
  stored, records = token_ids.stored(source, tok)
  assert records is None and len(stored) == len(source) == 120
  every = list(range(len(source)))
  for seq_len in (6, 16, 40):
    want = token_ids.encode_rows(pipeline.read_examples(source, every), tok, seq_len)
    got = stored.rows(every, seq_len, tok.pad_id)
    for w, g in zip(want, got):
      np.testing.assert_array_equal(g, w)


def test_stored_ids_follow_a_held_out_view_of_the_split(tmp_path):
  source = _prepared(tmp_path, _vocab_file(tmp_path))
  view = Subset(source, np.arange(len(source))[::3])
  stored, records = token_ids.stored(view, tiny_tokenizer())
  np.testing.assert_array_equal(records(np.arange(len(view))), np.arange(len(source))[::3])
  a = pipeline.mlm_pipeline(view, tiny_tokenizer(), seq_len=16, batch_size=8,
                            read=Reading(seed=1, shard_index=0, shard_count=1))
  plain = [{"text": ex["text"], "origin": ex["origin"]} for ex in
           pipeline.read_examples(source, list(range(0, len(source), 3)))]
  b = pipeline.mlm_pipeline(plain, tiny_tokenizer(), seq_len=16, batch_size=8,
                            read=Reading(seed=1, shard_index=0, shard_count=1))
  for x, y in zip(a, b, strict=True):  # stored ids and tokenising give the same batches
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def test_ids_from_another_tokenizer_are_refused(tmp_path):
  source = _prepared(tmp_path, _vocab_file(tmp_path))
  other = Tokenizer.from_vocab(VOCAB + ["extra"])
  with pytest.raises(DataError, match=r"stores token ids made by the tokenizer .*vocab\d+\.txt"
                     r".*prepare it again with this tokenizer"):
    pipeline.mlm_pipeline(source, other, seq_len=16, batch_size=4)


def test_prepare_restores_ids_when_the_tokenizer_changes(tmp_path, caplog):
  _prepared(tmp_path, _vocab_file(tmp_path))
  caplog.set_level("INFO", logger="jaxencoder")
  source = _prepared(tmp_path, _vocab_file(tmp_path, VOCAB + ["extra"]))
  assert "token ids made by another tokenizer: rebuilding" in caplog.text
  digest = json.loads((pathlib.Path(source.dataset_info.data_dir) /
                       "fingerprint.json").read_text())["tokenizer"]["sha256"]
  assert digest == token_ids.tokenizer_digest(Tokenizer.from_vocab(VOCAB + ["extra"]))
  caplog.clear()
  _prepared(tmp_path, _vocab_file(tmp_path, VOCAB + ["extra"]))
  assert "up to date" in caplog.text


def test_the_digest_ignores_truncation_state():
  tok = tiny_tokenizer()
  before = token_ids.tokenizer_digest(tok)
  tok.encode("the cat", max_length=4)
  assert token_ids.tokenizer_digest(tok) == before


# ------------------------------------------------------------------ workers
def _batches(it, n):
  return [next(it) for _ in range(n)]


def _assert_same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pad", "pack", "best_fit"])
def test_workers_make_the_same_batches_and_resume_exactly(tmp_path, mode):
  source = _prepared(tmp_path, _vocab_file(tmp_path))
  def make(workers):
    return pipeline.mlm_pipeline(source, tiny_tokenizer(), seq_len=16, batch_size=4, mode=mode,
                                 read=Reading(seed=2, num_epochs=None, shard_index=0,
                                              shard_count=1, workers=workers))
  alone = _batches(iter(make(0)), 12)
  it = iter(make(2))
  _assert_same(_batches(it, 5), alone[:5])
  state = it.get_state()
  _assert_same(_batches(it, 4), alone[5:9])
  it.close()
  resumed = iter(make(2))
  resumed.set_state(state)
  _assert_same(_batches(resumed, 7), alone[5:12])
  resumed.close()


# ------------------------------------------------------------------ device prefetch
class _Counter:
  """A checkpointable iterator of {"x": [k]}; raises at `fail_at`."""

  def __init__(self, fail_at=None):
    self.k, self.fail_at = 0, fail_at

  def __next__(self):
    if self.k == self.fail_at:
      raise DataError("bad record 3")
    self.k += 1
    return {"x": np.array([self.k - 1])}

  def get_state(self):
    return {"k": self.k}


def test_prefetch_state_is_the_next_unconsumed_batch():
  source = _Counter()
  prefetched = DevicePrefetch(source, put=lambda b: b["x"] * 10, depth=2)
  host, device = next(prefetched)
  assert host["x"].tolist() == [0] and device.tolist() == [0]
  time.sleep(0.2)  # the thread has read ahead
  assert source.k >= 3
  assert prefetched.get_state() == {"k": 1}
  next(prefetched)
  assert prefetched.get_state() == {"k": 2}
  prefetched.close()


def test_prefetch_raises_the_pipelines_error_in_the_step_loop():
  prefetched = DevicePrefetch(_Counter(fail_at=3), put=lambda b: b)
  assert [next(prefetched)[0]["x"][0] for _ in range(3)] == [0, 1, 2]
  with pytest.raises(DataError, match="bad record 3"):
    next(prefetched)
  prefetched.close()


def test_prefetch_counts_time_waiting_for_input():
  class Slow(_Counter):
    def __next__(self):
      time.sleep(0.05)
      return super().__next__()
  prefetched = DevicePrefetch(Slow(), put=lambda b: b, depth=1)
  for _ in range(4):
    next(prefetched)
  assert prefetched.take_wait_seconds() > 0.1
  assert prefetched.take_wait_seconds() == 0.0
  prefetched.close()
