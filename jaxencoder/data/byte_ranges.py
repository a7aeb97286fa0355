"""Byte ranges of files, local or on Cloud Storage, read without reading the files whole.

Local files are read with `os.pread` (no memory map: pages a map touches count towards
the reader's resident memory, so a map over a large corpus grows with it); gs:// objects
with ranged GETs through tensorstore's key-value store, all ranges of one call issued at
once and served concurrently by its C++ HTTP client (gcsfs's asyncio client spent about
1 ms of Python per range), at most MAX_IN_FLIGHT at a time per bucket: tensorstore's
default, 32, caps a process at 640 GETs/s from a bucket 50 ms away, whatever reads ahead.
Ranges of one file at most COALESCE_GAP bytes apart are read as one (rows read in order:
an eval split, an unshuffled pass). A reader may be shared by threads (the read-ahead
threads of pipeline.Reading.num_threads), and pickles without its open files and stores,
so a grain worker process opens its own.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Sequence

import numpy as np
import tensorstore as ts

from jaxencoder.io.paths import is_url

MAX_IN_FLIGHT = 512  # ranged GETs at once per bucket and process; the others wait their turn
COALESCE_GAP = 4096  # bytes: two ranges of a file at most this far apart are read as one


class RangeReader:
  """`read(path, starts, stops)`: the bytes [start, stop) of a file, for each pair."""

  def __init__(self):
    self._files: dict[str, int] = {}  # local path -> open descriptor
    self._stores: dict[str, object] = {}  # "gs://bucket" -> its tensorstore KvStore
    self._lock = threading.Lock()  # held while a file or a store is opened

  def __getstate__(self):
    return {}

  def __setstate__(self, state):
    self.__init__()

  def __del__(self):
    for fd in getattr(self, "_files", {}).values():
      try:
        os.close(fd)
      except OSError:
        pass

  def read(self, path: str, starts: Sequence[int], stops: Sequence[int]) -> list[bytes]:
    return self.read_many([path] * len(starts), starts, stops)

  def read_many(self, paths: Sequence[str], starts: Sequence[int],
                stops: Sequence[int]) -> list[bytes]:
    """The bytes [starts[i], stops[i]) of paths[i], for each i: one concurrent round of
    requests on an object store, one read serving the ranges of a file that `coalesce`
    joins."""
    if not len(paths):
      return []
    if len(set(paths)) == 1:
      file_N = np.zeros(len(paths), np.int64)
    else:
      ids: dict[str, int] = {}
      file_N = np.array([ids.setdefault(p, len(ids)) for p in paths], np.int64)
    starts_N, stops_N = np.asarray(starts, np.int64), np.asarray(stops, np.int64)
    read_N, first_R, stop_R = coalesce(file_N, starts_N, stops_N, COALESCE_GAP)
    where_R, begin_R = [paths[i] for i in first_R.tolist()], starts_N[first_R]
    if is_url(where_R[0]):
      blocks = self._read_objects(where_R, begin_R.tolist(), stop_R.tolist())
    else:
      blocks = [self._pread(path, a, b)
                for path, a, b in zip(where_R, begin_R.tolist(), stop_R.tolist())]
    ends_R = begin_R + np.array([len(b) for b in blocks], np.int64)
    if (ends_R < stop_R).any():
      _refuse_short(paths, starts_N, stops_N, ends_R[read_N])
    if len(first_R) == len(read_N):  # no range joined: each read is its range
      return [blocks[r] for r in read_N.tolist()]
    at_N = starts_N - begin_R[read_N]
    return [blocks[r][a:b] for r, a, b in zip(read_N.tolist(), at_N.tolist(),
                                               (at_N + stops_N - starts_N).tolist())]

  def _read_objects(self, urls, starts, stops) -> list[bytes]:
    futures = []
    for url, start, stop in zip(urls, starts, stops):
      store, key = self._store(url)
      futures.append(store.read(key, byte_range=slice(int(start), int(stop))))
    out = []
    for url, future in zip(urls, futures):
      try:
        result = future.result()
      except Exception as e:  # tensorstore: OUT_OF_RANGE past the end, ...
        raise OSError(f"{url}: ranged read failed ({e})") from e
      if result.state != "value":
        raise OSError(f"{url}: no such object")
      out.append(result.value)
    return out

  def _store(self, url: str):
    """(the KvStore of `url`'s bucket, the object's key)."""
    scheme, _, rest = url.partition("://")
    bucket, _, key = rest.partition("/")
    if scheme != "gs":
      raise OSError(f"{url}: ranged reads know gs:// and local files")
    store = self._stores.get(bucket)
    if store is None:
      with self._lock:
        store = self._stores.get(bucket)
        if store is None:
          spec = {"driver": "gcs", "bucket": bucket,
                  "gcs_request_concurrency": {"limit": MAX_IN_FLIGHT}}
          store = self._stores[bucket] = ts.KvStore.open(spec).result()
    return store, key

  def _pread(self, path: str, start: int, stop: int) -> bytes:
    fd = self._files.get(path)
    if fd is None:
      with self._lock:
        fd = self._files.get(path)
        if fd is None:
          fd = self._files[path] = os.open(path, os.O_RDONLY)
    return os.pread(fd, stop - start, start)


def coalesce(file_N: np.ndarray, starts_N: np.ndarray, stops_N: np.ndarray,
             gap: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The reads that serve byte ranges [starts_N, stops_N) of files file_N (ints): ranges
  of a file that overlap or lie at most `gap` bytes apart share one. Returns (read_N: the
  read serving each range, first_R: the range each read starts with, stop_R: where each
  read stops); read r covers [starts_N[first_R[r]], stop_R[r]) of file file_N[first_R[r]].
  Reads are in (file, start) order; together they hold at most (N - R) x gap bytes more
  than the ranges."""
  key_N = starts_N + file_N * (int(stops_N.max()) + gap + 1)  # files never join
  order_N = np.argsort(key_N, kind="stable")
  begin_N = key_N[order_N]
  reach_N = np.maximum.accumulate(begin_N + (stops_N - starts_N)[order_N])
  new_N = np.ones(len(order_N), bool)
  new_N[1:] = begin_N[1:] > reach_N[:-1] + gap
  read_N = np.empty(len(order_N), np.int64)
  read_N[order_N] = np.cumsum(new_N) - 1
  heads = np.flatnonzero(new_N)
  return read_N, order_N[heads], np.maximum.reduceat(stops_N[order_N], heads)


def _refuse_short(paths, starts_N: np.ndarray, stops_N: np.ndarray, ends_N: np.ndarray):
  """An OSError naming the first range whose read (ending at ends_N) stopped short."""
  i = int(np.argmax(ends_N < stops_N))
  got, want = max(0, int(ends_N[i] - starts_N[i])), int(stops_N[i] - starts_N[i])
  raise OSError(f"{paths[i]}: read {got} of {want} bytes at {starts_N[i]}: the file is "
                "shorter than its manifest says")


class BlockCache:
  """The last `capacity` blocks read, keyed by any hashable; least recently used go first.
  Safe to share between threads."""

  def __init__(self, capacity: int):
    self.capacity, self._blocks = capacity, collections.OrderedDict()
    self._lock = threading.Lock()

  def __getstate__(self):
    return {"capacity": self.capacity}

  def __setstate__(self, state):
    self.__init__(state["capacity"])

  def get(self, key):
    return self.get_many([key])[0]

  def get_many(self, keys) -> list:
    """The block of each key (None where it is not kept), in one hold of the lock."""
    with self._lock:
      blocks = [self._blocks.get(key) for key in keys]
      for key, block in zip(keys, blocks):
        if block is not None:
          self._blocks.move_to_end(key)
      return blocks

  def put(self, key, block) -> None:
    with self._lock:
      self._blocks[key] = block
      self._blocks.move_to_end(key)
      while len(self._blocks) > self.capacity:
        self._blocks.popitem(last=False)
