"""Progress of long phases, told the same way by every tool.

`bar(total, desc)`: on a terminal, a tqdm bar on stderr; otherwise (a log file, a pipe, a
notebook's captured stream) one plain line every `every` items and one at the end, so a
log never fills with carriage-return updates. `phase("compiling the train step")`: a line
when the phase starts and its seconds when it ends, with the elapsed seconds ticking on a
terminal meanwhile. Both are silent when `enabled` is False (e.g. on processes other than
process 0). JAXENCODER_PROGRESS=bar / lines / off forces a style.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator


def _style(enabled: bool, stream) -> str:
  """'bar', 'lines' or 'off'."""
  if not enabled:
    return "off"
  forced = os.environ.get("JAXENCODER_PROGRESS", "").strip().lower()
  if forced in ("bar", "lines", "off"):
    return forced
  isatty = getattr(stream, "isatty", None)
  if isatty is None or not isatty():
    return "lines"
  return "lines" if _no_width(stream) else "bar"


def _no_width(stream) -> bool:
  """A terminal with no width to draw a bar in (COLUMNS=0, or a pty that reports 0
  columns, as some containers and CI runners do): tqdm would show nothing there."""
  if os.environ.get("COLUMNS", "").strip() == "0":
    return True
  try:
    return os.get_terminal_size(stream.fileno()).columns < 2  # tqdm draws in columns - 1
  except (AttributeError, OSError, ValueError):  # no descriptor: a stream tqdm sizes as wide
    return False


def _rate(n: float, seconds: float, unit: str, seconds_per_item: bool = False) -> str:
  """items/s, or s/item when slower than one a second (or always, `seconds_per_item`)."""
  if n <= 0 or seconds <= 0:
    return f"- s/{unit}" if seconds_per_item else f"- {unit}/s"
  per_s = n / seconds
  if per_s < 1 or seconds_per_item:
    return f"{1 / per_s:.3g} s/{unit}"
  return f"{per_s:.3g} {unit}/s" if per_s < 1000 else f"{per_s:,.0f} {unit}/s"


def _clock(seconds: float) -> str:
  seconds = int(round(seconds))
  h, rest = divmod(seconds, 3600)
  return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60:02d}:{rest % 60:02d}"


class Progress:
  """Counts finished items of a phase (`update(n)`), shows rate and time left from them."""

  def __init__(self, total: int | None, desc: str, *, unit: str = "it", initial: int = 0,
               every: int | None = None, enabled: bool = True, stream=None,
               lines: bool = True, seconds_per_item: bool = False):
    """`lines` False: no plain lines (a caller that logs its own line per interval).
    `seconds_per_item`: the rate always in s/`unit` (never flipping to `unit`/s)."""
    self.total, self.desc, self.unit = total, desc, unit
    self._seconds_per_item = seconds_per_item
    self.n, self._start_n = initial, initial
    self._printed_n = initial  # the count of the last plain line (none yet: initial)
    self._stream = stream if stream is not None else sys.stderr
    self.style = _style(enabled, self._stream)
    if self.style == "lines" and not lines:
      self.style = "off"
    self._every = every or max(1, (total or 0) // 10) or 1
    self._next_line = initial + self._every
    self._started = time.perf_counter()
    self._postfix: dict[str, str] = {}
    self._tqdm = None
    self._closed = False
    self._logs = contextlib.ExitStack()
    if self.style == "bar":
      # lazy: --help stays fast (jaxencoder-predict imports this module)
      import tqdm
      from tqdm.contrib.logging import logging_redirect_tqdm
      self._tqdm = tqdm.tqdm(total=total, initial=initial, desc=desc, unit=unit,
                             dynamic_ncols=True, file=self._stream,
                             unit_scale=unit == "B", bar_format=_bar_format(seconds_per_item))
      # Log records print above the bar, not after it (which leaves a stale copy of the
      # bar in the terminal at every record).
      self._logs.enter_context(logging_redirect_tqdm())

  def __enter__(self) -> Progress:
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def update(self, n: int = 1) -> None:
    """`n` more items finished."""
    self.n += n
    if self._tqdm is not None:
      self._tqdm.update(n)
    elif self.style == "lines" and self.n >= self._next_line and self.n != self.total:
      self._line()
      self._next_line = (self.n // self._every + 1) * self._every

  def set_postfix(self, **values) -> None:
    """Values shown after the count (e.g. loss=...)."""
    self._postfix = {k: str(v) for k, v in values.items()}
    if self._tqdm is not None:
      self._tqdm.set_postfix(self._postfix, refresh=False)

  def elapsed(self) -> float:
    return time.perf_counter() - self._started

  def summary(self) -> str:
    """`desc: n/total items, rate, elapsed [, left]`, the plain line."""
    done, elapsed = self.n - self._start_n, self.elapsed()
    count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
    parts = [f"{self.desc}: {count} {self.unit}",
             _rate(done, elapsed, self.unit, self._seconds_per_item),
             f"{_clock(elapsed)} elapsed"]
    if self.total is not None and 0 < done and self.n < self.total:
      parts.append(f"{_clock(elapsed / done * (self.total - self.n))} left")
    parts += [f"{k}={v}" for k, v in self._postfix.items()]
    return ", ".join(parts)

  def _line(self) -> None:
    print(self.summary(), file=self._stream, flush=True)
    self._printed_n = self.n

  def close(self) -> None:
    """Ends the phase: the bar's last state, or one last plain line (once)."""
    if self._closed:
      return
    self._closed = True
    if self._tqdm is not None:
      self._logs.close()
      self._tqdm.close()
    elif self.style == "lines" and self.n != self._printed_n:  # not the same line twice
      self._line()


def _bar_format(seconds_per_item: bool) -> str | None:
  """tqdm's default layout, with its s/unit rate where that is the one unit."""
  if not seconds_per_item:
    return None
  return "{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_inv_fmt}{postfix}]"


def bar(total: int | None, desc: str, **kwargs) -> Progress:
  """A Progress (see the module doc)."""
  return Progress(total, desc, **kwargs)


def track(items, desc: str, *, total: int | None = None, **kwargs) -> Iterator:
  """Yields `items`, counting each one finished when the next is asked for."""
  if total is None and hasattr(items, "__len__"):
    total = len(items)
  with Progress(total, desc, **kwargs) as progress:
    for item in items:
      yield item
      progress.update(1)


@contextlib.contextmanager
def phase(what: str, *, enabled: bool = True, stream=None, tick_s: float = 1.0):
  """`what...` when it starts and `what: X.X s` when it ends; on a terminal the elapsed
  seconds tick in place meanwhile. Yields a dict; its "seconds" is set at the end."""
  stream = stream if stream is not None else sys.stderr
  style = _style(enabled, stream)
  result: dict[str, float] = {}
  started = time.perf_counter()
  stop = threading.Event()
  ticker = None
  if style == "bar":
    def tick():
      while not stop.wait(tick_s):
        print(f"\r{what}... {time.perf_counter() - started:.0f} s", end="", file=stream,
              flush=True)
    print(f"{what}...", end="", file=stream, flush=True)
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    clear = _ClearLine(stream)
  elif style == "lines":
    print(f"{what}...", file=stream, flush=True)
  try:
    yield result
  finally:
    stop.set()
    if ticker is not None:
      ticker.join()
      clear.remove()
    result["seconds"] = time.perf_counter() - started
    if style == "bar":
      print(f"\r{what}: {result['seconds']:.1f} s", file=stream, flush=True)
    elif style == "lines":
      print(f"{what}: {result['seconds']:.1f} s", file=stream, flush=True)


class _ClearLine(logging.Filter):
  """On the root handlers writing to `stream`: clears the terminal line (a ticking phase)
  before a log record is written on it; the next tick redraws the phase below it."""

  def __init__(self, stream):
    super().__init__()
    self.stream = stream
    self.handlers = [h for h in logging.getLogger().handlers
                     if getattr(h, "stream", None) is stream]
    for handler in self.handlers:
      handler.addFilter(self)

  def filter(self, record) -> bool:
    print("\r\x1b[K", end="", file=self.stream, flush=True)
    return True

  def remove(self) -> None:
    for handler in self.handlers:
      handler.removeFilter(self)
