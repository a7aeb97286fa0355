"""Batches put on the devices ahead of the step, and the time the step waited for them."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

_DONE = object()


class DevicePrefetch:
  """Yields (host_batch, device_batch) from a grain iterator; a thread reads the next
  `depth` host batches while the current step runs. `put` (the sharded device_put) runs
  in the consumer's thread: device_put from the reading thread while hundreds of steps
  were queued asynchronously aborted the process (XLA:CPU, jax 0.10.2, tests/test_readme).

  `get_state()` is the iterator's state before the next batch this yields (not the
  thread's read position), so a checkpoint taken between steps resumes exactly.
  `take_wait_seconds()` returns (and resets) the time spent blocked on input.
  """

  def __init__(self, iterator, put: Callable[[dict], Any], depth: int = 2):
    self._iterator, self._put = iterator, put
    self._state = iterator.get_state()
    self._queue: queue.Queue = queue.Queue(maxsize=depth)
    self._stop = threading.Event()
    self._wait = 0.0
    self._thread = threading.Thread(target=self._fill, name="device-prefetch", daemon=True)
    self._thread.start()

  def _fill(self) -> None:
    while not self._stop.is_set():
      try:
        host = next(self._iterator)
        item = (host, self._iterator.get_state())
      except StopIteration:
        item = _DONE
      except BaseException as e:  # raised in the consumer's thread, by __next__
        item = e
      while not self._stop.is_set():
        try:
          self._queue.put(item, timeout=0.1)
          break
        except queue.Full:
          continue
      if item is _DONE or isinstance(item, BaseException):
        return

  def __iter__(self):
    return self

  def __next__(self) -> tuple[dict, Any]:
    start = time.perf_counter()
    item = self._queue.get()
    self._wait += time.perf_counter() - start
    if item is _DONE:
      self._queue.put(item)
      raise StopIteration
    if isinstance(item, BaseException):
      self._queue.put(item)
      raise item
    host, self._state = item
    return host, self._put(host)

  def get_state(self):
    return self._state

  def take_wait_seconds(self) -> float:
    wait, self._wait = self._wait, 0.0
    return wait

  def close(self) -> None:
    """Stops the thread (it may be blocked on a full queue); the iterator stays usable
    from get_state()."""
    self._stop.set()
    self._thread.join(timeout=5)
