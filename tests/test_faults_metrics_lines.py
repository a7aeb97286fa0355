"""A damaged line in metrics.jsonl (a crash mid-write) is named by file:line and set
aside; it never makes a run unresumable, and no row or damaged text is lost."""

import json
import logging

import pytest

from jaxencoder.io.run_dir import METRICS, RunDir, read_metrics
from jaxencoder.probing import health
from jaxencoder.train import plots


def row(step, split="train", **values):
  return json.dumps({"step": step, "split": split, "loss": 1.0 / step, **values})


def write(workdir, text):
  (workdir / METRICS).write_text(text)


PARTIAL = '{"step": 3, "split": "train", "time": 17.5, "loss"'  # cut mid-write


def test_a_partial_last_line_is_skipped_with_a_warning_naming_file_and_line(tmp_path, caplog):
  write(tmp_path, row(1) + "\n" + row(2) + "\n" + PARTIAL)
  with caplog.at_level(logging.WARNING, logger="jaxencoder"):
    rows = read_metrics(tmp_path)
  assert [r["step"] for r in rows] == [1, 2]
  [warning] = [r.getMessage() for r in caplog.records]
  assert warning.startswith(f"{tmp_path / METRICS}:3: damaged metrics line (")
  assert "Expecting" in warning and warning.endswith("skipped")
  assert (tmp_path / METRICS).read_text().endswith(PARTIAL)  # reading changes nothing


def test_resuming_moves_damaged_lines_aside_and_keeps_every_good_row_once(tmp_path, caplog):
  write(tmp_path, "\n".join([row(1), row(2), "not json", row(2, "eval"), row(4), PARTIAL]))
  with caplog.at_level(logging.WARNING, logger="jaxencoder"):
    dropped = RunDir(tmp_path).drop_metrics_after(2)
  assert dropped == 1  # step 4: past the restored checkpoint
  assert (tmp_path / METRICS).read_text() == "\n".join([row(1), row(2), row(2, "eval")]) + "\n"
  damaged = tmp_path / f"{METRICS}.damaged"
  assert damaged.read_text() == "not json\n" + PARTIAL + "\n"
  [warning] = [r.getMessage() for r in caplog.records]
  assert warning.startswith(f"{tmp_path / METRICS}:3: damaged metrics line (")
  assert warning.endswith(f"; also lines 6; moved to {damaged}")


def test_appending_after_a_resume_starts_on_a_fresh_line(tmp_path):
  write(tmp_path, row(1) + "\n" + PARTIAL)
  RunDir(tmp_path).drop_metrics_after(1)
  with open(tmp_path / METRICS, "a") as f:  # what MetricWriter does next
    f.write(row(2) + "\n")
  assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_a_second_damage_is_appended_to_the_damaged_file(tmp_path):
  write(tmp_path, row(1) + "\n" + PARTIAL)
  RunDir(tmp_path).drop_metrics_after(1)
  write(tmp_path, row(1) + "\n" + "[1, 2]\n")
  RunDir(tmp_path).drop_metrics_after(1)
  assert (tmp_path / f"{METRICS}.damaged").read_text() == PARTIAL + "\n[1, 2]\n"
  assert (tmp_path / METRICS).read_text() == row(1) + "\n"


def test_an_intact_file_is_not_rewritten(tmp_path):
  write(tmp_path, row(1) + "\n" + row(2) + "\n")
  before = (tmp_path / METRICS).stat().st_mtime_ns
  assert RunDir(tmp_path).drop_metrics_after(5) == 0
  assert (tmp_path / METRICS).stat().st_mtime_ns == before
  assert not (tmp_path / f"{METRICS}.damaged").exists()


def test_the_other_readers_skip_a_damaged_line(tmp_path):
  pytest.importorskip("matplotlib")
  write(tmp_path, row(1) + "\n" + row(2, "eval") + "\n" + PARTIAL)
  assert [p.name for p in plots.plot_metrics(tmp_path, tmp_path / "plots")] == ["loss.png"]
  assert "verdict" in health.workdir_health(tmp_path)
  assert [r["step"] for r in RunDir(tmp_path).read_metrics()] == [1, 2]
