"""Reading stored token ids from far away: ranges of a file that touch share one read,
read-ahead threads (Reading.num_threads) overlap slow reads and keep the batches, at most
MAX_IN_FLIGHT ranged GETs at once, data.num_threads=-1 reads ahead from gs:// only, and
bench/latency_proxy.py holds each request as a far bucket would."""

import pathlib
import sys
import threading
import time
import types
import urllib.request

import numpy as np
import pytest

from data_helpers import VOCAB, WORDS, assert_batches_equal, tiny_tokenizer
from gcs_emulator import gcs  # noqa: F401 (fixture)
from jaxencoder.data import builders, byte_ranges, pipeline, sources, token_ids
from jaxencoder.data.pipeline import Reading
from jaxencoder.io.paths import copy_tree

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench"))
from latency_proxy import LatencyProxy  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """200 paragraphs of 1..30 words prepared with the tiny vocab's ids, in shards of
  about 500 tokens (several files to read)."""
  root = tmp_path_factory.mktemp("ahead")
  rng = np.random.default_rng(0)
  (root / "src").mkdir()
  paragraphs = [" ".join(rng.choice(WORDS, size=rng.integers(1, 31))) for _ in range(200)]
  (root / "src" / "a.txt").write_text("\n\n".join(paragraphs) + "\n")
  (root / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(token_ids, "SHARD_TOKENS", 500)
    out = builders.prepare("text_corpus", root / "src", root / "tfds", name="c",
                           tokenizer=str(root / "vocab.txt"))
  return sources.open_source(str(out))


def _batches(source, n, *, mode="pack", threads=0, batch_size=8):
  it = iter(pipeline.mlm_pipeline(source, tiny_tokenizer(), seq_len=16, batch_size=batch_size,
                                  mode=mode, read=Reading(seed=1, num_epochs=None, shard_index=0,
                                                          shard_count=1, num_threads=threads)))
  return [next(it) for _ in range(n)]


# ------------------------------------------------------------------ joined reads
def test_ranges_a_gap_apart_share_a_read_and_farther_ones_do_not():
  file_N = np.array([0, 0, 0, 0, 1, 1])
  starts_N, stops_N = np.array([0, 15, 36, 37, 5, 0]), np.array([5, 20, 40, 38, 9, 5])
  read_N, first_R, stop_R = byte_ranges.coalesce(file_N, starts_N, stops_N, gap=10)
  # file 0: [0,5) and [15,20) are 10 apart (joined), [36,40) 16 past them, [37,38) inside
  # it; file 1's ranges touch each other, never file 0's
  np.testing.assert_array_equal(read_N, [0, 0, 1, 1, 2, 2])
  np.testing.assert_array_equal(starts_N[first_R], [0, 36, 0])
  np.testing.assert_array_equal(stop_R, [20, 40, 9])


def test_every_range_lies_in_the_one_read_that_serves_it():
  rng = np.random.default_rng(0)
  file_N = rng.integers(0, 3, 500)
  starts_N = rng.integers(0, 100_000, 500)
  stops_N = starts_N + rng.integers(0, 300, 500)
  read_N, first_R, stop_R = byte_ranges.coalesce(file_N, starts_N, stops_N, gap=64)
  begin_R, file_R = starts_N[first_R], file_N[first_R]
  assert (file_R[read_N] == file_N).all()
  assert (begin_R[read_N] <= starts_N).all() and (stops_N <= stop_R[read_N]).all()
  for f in range(3):  # a file's reads: in order, each more than the gap past the last
    begin, stop = begin_R[file_R == f], stop_R[file_R == f]
    assert (begin[1:] > stop[:-1] + 64).all()
  assert (stop_R - begin_R).sum() <= (stops_N - starts_N).sum() + 64 * (500 - len(first_R))


def test_joined_reads_give_each_range_its_bytes_in_one_read_per_group(tmp_path, monkeypatch):
  rng = np.random.default_rng(1)
  data = {name: rng.integers(0, 256, 50_000, dtype=np.uint8).tobytes() for name in "ab"}
  for name, blob in data.items():
    (tmp_path / name).write_bytes(blob)
  names = rng.choice(list("ab"), 300)
  starts = rng.integers(0, 49_000, 300)
  stops = starts + rng.integers(0, 1_000, 300)
  starts[:3], stops[:3] = starts[3], stops[3]  # the same range four times
  reads = []
  pread = byte_ranges.RangeReader._pread
  monkeypatch.setattr(byte_ranges.RangeReader, "_pread",
                      lambda self, *a: reads.append(a) or pread(self, *a))
  paths = [str(tmp_path / n) for n in names]
  got = byte_ranges.RangeReader().read_many(paths, starts, stops)
  assert got == [data[n][s:e] for n, s, e in zip(names, starts, stops)]
  ids = np.array([ord(n) for n in names])
  assert len(reads) == len(byte_ranges.coalesce(ids, starts, stops,
                                                byte_ranges.COALESCE_GAP)[1]) < 300


def test_rows_read_in_order_take_one_token_read_per_shard(corpus, monkeypatch):
  stored, _ = token_ids.stored(corpus, tiny_tokenizer())
  shards = len(stored.entry["shards"])
  assert shards >= 3
  every = np.arange(len(corpus))
  want = [stored.rows([i], 16, 0) for i in every]  # one example at a time
  reads = []
  pread = byte_ranges.RangeReader._pread
  monkeypatch.setattr(byte_ranges.RangeReader, "_pread",
                      lambda self, path, *a: reads.append(path) or pread(self, path, *a))
  got = stored.rows(every, 16, 0)
  assert sum(path.endswith(".tokens.bin") for path in reads) == shards
  for i, row in enumerate(want):
    for g, w in zip(got, row):
      np.testing.assert_array_equal(g[i], w[0])


# ------------------------------------------------------------------ read-ahead threads
@pytest.mark.parametrize("mode", ["pad", "pack"])
def test_read_ahead_threads_give_the_batches_of_reading_in_the_caller(corpus, mode, monkeypatch):
  want = _batches(corpus, 12, mode=mode)
  cache = byte_ranges.BlockCache
  monkeypatch.setattr(token_ids, "BlockCache", lambda capacity: cache(2))  # threads evict
  assert_batches_equal(_batches(corpus, 12, mode=mode, threads=4), want)


def test_a_reading_ahead_iterator_resumes_at_the_next_batch(corpus):
  make = lambda: iter(pipeline.mlm_pipeline(  # noqa: E731
      corpus, tiny_tokenizer(), seq_len=16, batch_size=8, mode="pack",
      read=Reading(seed=1, num_epochs=None, shard_index=0, shard_count=1, num_threads=4)))
  whole, it = _batches(corpus, 9), make()
  assert_batches_equal([next(it) for _ in range(4)], whole[:4])
  state = it.get_state()  # while the threads hold chunks read ahead
  resumed = make()
  resumed.set_state(state)
  assert_batches_equal([next(resumed) for _ in range(5)], whole[4:])


class SlowFiles:
  """RangeReader._pread that sleeps first, counting the reads under way and the rows
  gathered: a file system far away."""

  def __init__(self, monkeypatch, seconds: float):
    self.lock, self.now, self.most, self.rows = threading.Lock(), 0, 0, 0
    pread, rows = byte_ranges.RangeReader._pread, token_ids.StoredIds.rows

    def slow_pread(reader, *args):
      with self.lock:
        self.now += 1
        self.most = max(self.most, self.now)
      time.sleep(seconds)
      with self.lock:
        self.now -= 1
      return pread(reader, *args)

    def counted_rows(ids, *args):
      with self.lock:
        self.rows += 1
      return rows(ids, *args)

    monkeypatch.setattr(byte_ranges.RangeReader, "_pread", slow_pread)
    monkeypatch.setattr(token_ids.StoredIds, "rows", counted_rows)


def test_read_ahead_overlaps_slow_reads_and_holds_at_most_twice_its_threads(corpus,
                                                                           monkeypatch):
  want = _batches(corpus, 6, mode="pad")
  files = SlowFiles(monkeypatch, 0.01)
  got = _batches(corpus, 6, mode="pad", threads=3)  # pad: a chunk is a batch
  assert_batches_equal(got, want)
  assert 1 < files.most <= 3  # reads overlap, one at a time per thread
  assert files.rows <= 6 + 2 * 3  # the batches taken and at most 2 x threads ahead


# ------------------------------------------------------------------ gs:// far away
@pytest.fixture
def far(gcs, tmp_path, monkeypatch):
  """(url of a 100 kB object on the emulator, its bytes, a LatencyProxy 20 ms in front of
  the emulator that tensorstore opens its stores through)."""
  data = np.random.default_rng(2).integers(0, 256, 100_000, dtype=np.uint8).tobytes()
  (tmp_path / "far").mkdir()
  (tmp_path / "far" / "blob.bin").write_bytes(data)
  copy_tree(tmp_path / "far", gcs.url("far"))
  port = int(gcs.endpoint.rsplit(":", 1)[1])
  with LatencyProxy(("127.0.0.1", port), delay_ms=20) as proxy:
    monkeypatch.setenv("TENSORSTORE_GCS_HTTP_URL", proxy.endpoint)
    yield gcs.url("far/blob.bin"), data, proxy


def test_at_most_max_in_flight_ranged_gets_are_under_way(far, monkeypatch):
  url, data, proxy = far
  monkeypatch.setattr(byte_ranges, "MAX_IN_FLIGHT", 4)
  starts = np.arange(0, 96_000, 3_000)  # 32 ranges, too far apart to join
  got = byte_ranges.RangeReader().read(url, starts, starts + 100)
  assert got == [data[s:s + 100] for s in starts]
  assert 1 <= proxy.peak_connections <= 4 < len(starts)  # one GET at a time per connection


def test_the_latency_proxy_holds_each_request_and_passes_its_answer(far, gcs):
  _, data, proxy = far
  path = "/storage/v1/b/bucket/o/far%2Fblob.bin?alt=media"
  started = time.perf_counter()
  with urllib.request.urlopen(proxy.endpoint + path, timeout=30) as answer:
    relayed = answer.read()
  held = time.perf_counter() - started
  assert relayed == data
  assert held >= 0.02  # at least the delay (a lower bound: a loaded machine only adds)
  assert proxy.connections == 1


def test_a_latency_proxy_serves_loopback_only():
  with pytest.raises(ValueError, match="loopback only"):
    LatencyProxy(("10.0.0.1", 80), delay_ms=1)


# ------------------------------------------------------------------ data.num_threads
def _config(threads: int):
  return types.SimpleNamespace(data=types.SimpleNamespace(num_threads=threads))


def _split(data_dir: str):
  return types.SimpleNamespace(dataset_info=types.SimpleNamespace(data_dir=data_dir))


def test_num_threads_reads_ahead_by_default_from_an_object_store_only():
  from jaxencoder.data import splits
  far, near = _split("gs://b/tfds/c/1.0.0"), _split("/data/tfds/c/1.0.0")
  view = types.SimpleNamespace(source=far)  # a held-out view of the split
  mixed = types.SimpleNamespace(members=[near, view])
  assert splits.num_threads(_config(-1), far) == splits.READ_AHEAD_THREADS > 0
  assert splits.num_threads(_config(-1), view) == splits.READ_AHEAD_THREADS
  assert splits.num_threads(_config(-1), mixed) == splits.READ_AHEAD_THREADS
  assert splits.num_threads(_config(-1), near) == 0
  assert splits.num_threads(_config(2), near) == 2
  assert splits.num_threads(_config(0), far) == 0
  with pytest.raises(ValueError, match=r"data.num_threads=-2: give 0 or more threads, or -1"):
    splits.num_threads(_config(-2), far)
