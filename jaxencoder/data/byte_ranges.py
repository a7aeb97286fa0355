"""Byte ranges of files, local or on Cloud Storage, read without reading the files whole.

Local files are read with `os.pread` (no memory map: pages a map touches count towards
the reader's resident memory, so a map over a large corpus grows with it); gs:// objects
with ranged GETs through tensorstore's key-value store, all ranges of one call issued at
once and served concurrently by its C++ HTTP client (gcsfs's asyncio client spent about
1 ms of Python per range). A reader pickles without its open files and stores, so a
grain worker process opens its own.
"""

from __future__ import annotations

import collections
import os
from collections.abc import Sequence

from jaxencoder.io.paths import is_url


class RangeReader:
  """`read(path, starts, stops)`: the bytes [start, stop) of a file, for each pair."""

  def __init__(self):
    self._files: dict[str, int] = {}  # local path -> open descriptor
    self._stores: dict[str, object] = {}  # "gs://bucket" -> its tensorstore KvStore

  def __getstate__(self):
    return {"_files": {}, "_stores": {}}

  def __del__(self):
    for fd in self._files.values():
      try:
        os.close(fd)
      except OSError:
        pass

  def read(self, path: str, starts: Sequence[int], stops: Sequence[int]) -> list[bytes]:
    return self.read_many([path] * len(starts), starts, stops)

  def read_many(self, paths: Sequence[str], starts: Sequence[int],
                stops: Sequence[int]) -> list[bytes]:
    """The bytes [starts[i], stops[i]) of paths[i], for each i (one concurrent round of
    requests on an object store)."""
    if not len(paths):
      return []
    if is_url(paths[0]):
      out = self._read_objects(paths, starts, stops)
    else:
      out = [self._pread(path, int(start), int(stop))
             for path, start, stop in zip(paths, starts, stops)]
    for path, start, stop, data in zip(paths, starts, stops, out):
      if len(data) != int(stop) - int(start):
        raise OSError(f"{path}: read {len(data)} of {int(stop) - int(start)} bytes at "
                      f"{int(start)}: the file is shorter than its manifest says")
    return out

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
      import tensorstore as ts
      store = self._stores[bucket] = ts.KvStore.open({"driver": "gcs",
                                                     "bucket": bucket}).result()
    return store, key

  def _pread(self, path: str, start: int, stop: int) -> bytes:
    fd = self._files.get(path)
    if fd is None:
      fd = self._files[path] = os.open(path, os.O_RDONLY)
    return os.pread(fd, stop - start, start)


class BlockCache:
  """The last `capacity` blocks read, keyed by any hashable; least recently used go first."""

  def __init__(self, capacity: int):
    self.capacity, self._blocks = capacity, collections.OrderedDict()

  def __getstate__(self):
    return {"capacity": self.capacity, "_blocks": collections.OrderedDict()}

  def get(self, key):
    block = self._blocks.get(key)
    if block is not None:
      self._blocks.move_to_end(key)
    return block

  def put(self, key, block) -> None:
    self._blocks[key] = block
    self._blocks.move_to_end(key)
    while len(self._blocks) > self.capacity:
      self._blocks.popitem(last=False)
