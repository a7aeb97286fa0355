"""jaxencoder.progress: the plain lines a log file gets, and silence when disabled."""

import io
import logging

import pytest

from jaxencoder import progress


class Clock:
  """A perf_counter that moves only when told."""

  def __init__(self):
    self.now = 100.0

  def __call__(self) -> float:
    return self.now


@pytest.fixture
def clock(monkeypatch):
  monkeypatch.delenv("JAXENCODER_PROGRESS", raising=False)
  fake = Clock()
  monkeypatch.setattr(progress.time, "perf_counter", fake)
  return fake


def steps(bar, clock, n, seconds_each=0.5):
  for _ in range(n):
    clock.now += seconds_each
    bar.update(1)


def test_a_log_file_gets_one_line_every_few_items_with_rate_and_time_left(clock):
  out = io.StringIO()
  bar = progress.bar(10, "train", unit="step", every=3, stream=out)
  steps(bar, clock, 7)
  assert bar.n == 7
  assert out.getvalue().splitlines() == [
      "train: 3/10 step, 2 step/s, 00:02 elapsed, 00:04 left",  # 1.5 s, 7 x 0.5 s to go
      "train: 6/10 step, 2 step/s, 00:03 elapsed, 00:02 left"]
  assert "\r" not in out.getvalue()


def test_close_prints_the_last_line_once_without_time_left(clock):
  out = io.StringIO()
  bar = progress.bar(4, "eval", unit="batch", every=10, stream=out)
  steps(bar, clock, 4, seconds_each=2.0)
  bar.set_postfix(loss="0.25")
  bar.close()
  bar.close()
  assert out.getvalue().splitlines() == ["eval: 4/4 batch, 2 s/batch, 00:08 elapsed, loss=0.25"]


def test_a_resumed_count_rates_only_the_items_done_here(clock):
  out = io.StringIO()
  with progress.bar(100, "train", unit="step", initial=90, every=5, stream=out) as bar:
    steps(bar, clock, 5, seconds_each=0.25)
  assert out.getvalue().splitlines() == [  # stopped there: close does not repeat the line
      "train: 95/100 step, 4 step/s, 00:01 elapsed, 00:01 left"]


def test_nothing_done_prints_nothing_at_close(clock):
  out = io.StringIO()
  progress.bar(10, "train", stream=out).close()
  assert out.getvalue() == ""


def test_a_disabled_bar_counts_but_prints_nothing(clock):
  out = io.StringIO()
  with progress.bar(10, "train", every=1, enabled=False, stream=out) as bar:
    steps(bar, clock, 10)
  assert bar.n == 10 and out.getvalue() == ""


def test_the_environment_turns_progress_off(clock, monkeypatch):
  monkeypatch.setenv("JAXENCODER_PROGRESS", "off")
  out = io.StringIO()
  with progress.bar(3, "train", every=1, stream=out) as bar:
    steps(bar, clock, 3)
  with progress.phase("compiling the train step", stream=out):
    pass
  assert out.getvalue() == ""


def test_track_counts_an_item_when_the_next_is_asked_for(clock):
  out = io.StringIO()
  seen = []
  for item in progress.track(["a", "b", "c"], "files", every=1, stream=out):
    seen.append(item)
  assert seen == ["a", "b", "c"]
  assert [line.split(",")[0] for line in out.getvalue().splitlines()] == [
      "files: 1/3 it", "files: 2/3 it", "files: 3/3 it"]


def test_a_phase_prints_its_start_and_its_seconds(clock):
  out = io.StringIO()
  with progress.phase("compiling the train step", stream=out) as timed:
    clock.now += 12.34
  assert out.getvalue().splitlines() == ["compiling the train step...",
                                         "compiling the train step: 12.3 s"]
  assert timed["seconds"] == pytest.approx(12.34)


def test_a_disabled_phase_is_silent_but_timed(clock):
  out = io.StringIO()
  with progress.phase("restoring step 5", enabled=False, stream=out) as timed:
    clock.now += 2.0
  assert out.getvalue() == "" and timed["seconds"] == pytest.approx(2.0)


def test_a_phase_on_a_terminal_clears_its_line_before_a_log_record(monkeypatch):
  monkeypatch.setenv("JAXENCODER_PROGRESS", "bar")
  out = io.StringIO()
  handler = logging.StreamHandler(out)
  logging.getLogger().addHandler(handler)
  try:
    with progress.phase("initialising the model state", stream=out, tick_s=60):
      logging.getLogger("jaxencoder.test").warning("a record")
  finally:
    logging.getLogger().removeHandler(handler)
  text = out.getvalue()
  assert text.startswith("initialising the model state...\r\x1b[Ka record\n\r"
                         "initialising the model state: ")
  assert not handler.filters  # the phase's filter left with it


class Terminal(io.StringIO):
  """A stream that says it is a terminal, `columns` wide."""

  def __init__(self, columns: int):
    super().__init__()
    self.columns = columns

  def isatty(self) -> bool:
    return True

  def fileno(self) -> int:
    return 99


def terminal_of(monkeypatch, columns: int) -> Terminal:
  stream = Terminal(columns)
  monkeypatch.setattr(progress.os, "get_terminal_size",
                      lambda fd: __import__("os").terminal_size((stream.columns, 24)))
  return stream


def test_a_zero_width_terminal_gets_plain_lines_not_an_invisible_bar(clock, monkeypatch):
  monkeypatch.delenv("COLUMNS", raising=False)
  out = terminal_of(monkeypatch, 0)
  with progress.bar(4, "train", unit="step", every=2, stream=out) as bar:
    assert bar.style == "lines"
    steps(bar, clock, 4)
  assert out.getvalue().splitlines() == [
      "train: 2/4 step, 2 step/s, 00:01 elapsed, 00:01 left",
      "train: 4/4 step, 2 step/s, 00:02 elapsed"]


def test_columns_zero_gets_plain_lines_and_a_wide_terminal_its_bar(clock, monkeypatch):
  out = terminal_of(monkeypatch, 80)
  monkeypatch.setenv("COLUMNS", "0")
  assert progress.bar(4, "train", stream=out, every=2).style == "lines"
  monkeypatch.delenv("COLUMNS")
  wide = progress.bar(4, "train", stream=out, every=2)
  assert wide.style == "bar"
  wide.close()


def test_seconds_per_item_is_the_one_unit_however_fast(clock):
  out = io.StringIO()
  with progress.bar(4, "train", unit="step", every=2, stream=out,
                    seconds_per_item=True) as bar:
    steps(bar, clock, 4, seconds_each=0.25)
  assert [line.split(", ")[1] for line in out.getvalue().splitlines()] == [
      "0.25 s/step", "0.25 s/step"]


def test_a_bar_without_lines_counts_but_prints_none(clock):
  out = io.StringIO()
  with progress.bar(4, "train", every=1, stream=out, lines=False) as bar:
    steps(bar, clock, 4)
  assert bar.n == 4 and out.getvalue() == ""
