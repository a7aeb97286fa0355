"""jaxencoder-plot: what each figure draws, read back from its Axes."""

import json

import numpy as np
import pytest

from jaxencoder.train import plots
from jaxencoder.train.optim import learning_rate_schedule

pytest.importorskip("matplotlib")

OPTIM = {"learning_rate": 1e-3, "warmup_steps": 30, "schedule": "linear", "total_steps": 100}
CONFIG = {"num_train_steps": 100, "optim": OPTIM}


def train_rows(steps, **extra):
  """Train rows as the loop logs them: learning_rate is what update `step` applied."""
  lr = learning_rate_schedule(OPTIM)
  return [{"step": s, "split": "train", "time": 0.0, "loss": 1.0 / s, "grad_norm": 0.5,
           "learning_rate": float(lr(s - 1)), "tokens_per_s": 1000.0 + s,
           "examples_per_s": 10.0, **extra} for s in steps]


def line(ax, label):
  (found,) = [l for l in ax.lines if l.get_label() == label]
  return found.get_xdata(), found.get_ydata()


def test_the_lr_plot_draws_the_schedule_at_every_step_through_the_warmup_peak():
  figs = plots.figures(train_rows([50, 100]), CONFIG)
  ax = figs["learning_rate"].axes[0]
  steps, lrs = line(ax, plots.SCHEDULE)
  assert list(steps) == list(range(1, 101))
  peak = float(learning_rate_schedule(OPTIM)(30))  # the end of the warmup: 1e-3
  assert peak == pytest.approx(1e-3, rel=1e-6)
  assert lrs.max() == peak and lrs[steps == 31][0] == peak  # update 31 applies step 30's LR
  logged_steps, logged = line(ax, "train")
  assert list(logged_steps) == [50, 100]
  # on the line (float32: a vectorised schedule may differ in the last bits)
  np.testing.assert_allclose(logged, lrs[np.isin(steps, logged_steps)], rtol=1e-5)


def test_without_a_stored_config_the_lr_plot_shows_the_logged_points_only():
  ax = plots.figures(train_rows([50, 100]), {})["learning_rate"].axes[0]
  assert [l.get_label() for l in ax.lines] == ["train"]


def test_a_three_step_run_has_integer_step_ticks():
  figs = plots.figures(train_rows([1, 2, 3]), {"num_train_steps": 3, "optim": {
      "learning_rate": 1e-3, "warmup_steps": 1, "total_steps": 3}})
  for fig in figs.values():
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) and np.array_equal(ticks, np.round(ticks)), ticks


def test_each_eval_metric_of_the_task_gets_a_plot_with_train_eval_and_test_points():
  records = train_rows([1, 2, 3, 4], accuracy=0.5) + [
      {"step": 2, "split": "eval", "time": 0.0, "loss": 0.9, "accuracy": 0.6, "f1": 0.4},
      {"step": 4, "split": "eval", "time": 0.0, "loss": 0.8, "accuracy": 0.7, "f1": 0.5},
      {"step": 4, "split": "test", "time": 0.0, "loss": 0.85, "accuracy": 0.65, "f1": 0.45}]
  figs = plots.figures(records, CONFIG)
  assert list(figs) == ["loss", "accuracy", "f1", "learning_rate", "grad_norm", "tokens_per_s"]
  ax = figs["f1"].axes[0]
  assert [l.get_label() for l in ax.lines] == ["eval", "test"]
  assert list(line(ax, "eval")[1]) == [0.4, 0.5]
  assert [l.get_label() for l in figs["accuracy"].axes[0].lines] == ["train", "eval", "test"]
  assert list(line(figs["tokens_per_s"].axes[0], "train")[1]) == [1001, 1002, 1003, 1004]


def test_runs_without_tokens_plot_examples_per_second():
  records = [{**r, "tokens_per_s": 0.0} for r in train_rows([1, 2])]
  assert "examples_per_s" in plots.figures(records, {})
  assert "tokens_per_s" not in plots.figures(records, {})


def test_legends_sit_outside_the_data_area():
  fig = plots.figures(train_rows([1, 2, 3]), CONFIG)["learning_rate"]
  fig.draw_without_rendering()
  ax = fig.axes[0]
  legend = ax.get_legend().get_window_extent()
  assert legend.x0 >= ax.get_window_extent().x1


def test_plot_metrics_writes_a_png_per_figure(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in train_rows([1, 2, 3])))
  paths = plots.plot_metrics(tmp_path, tmp_path / "plots")
  assert [p.name for p in paths] == ["loss.png", "learning_rate.png", "grad_norm.png",
                                     "tokens_per_s.png"]
  assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_a_metric_zero_at_every_step_gets_no_plot_and_is_named(tmp_path, capsys):
  records = train_rows([1, 2]) + [
      {"step": 2, "split": "eval", "time": 0.0, "loss": 0.9, "dropped_predictions": 0.0,
       "accuracy": 0.0},
      {"step": 4, "split": "eval", "time": 0.0, "loss": 0.8, "dropped_predictions": 0.0,
       "accuracy": 0.25}]  # 0 once, then not: plotted
  assert plots.never_nonzero(records) == ["dropped_predictions"]
  assert list(plots.figures(records, CONFIG)) == ["loss", "accuracy", "learning_rate",
                                                  "grad_norm", "tokens_per_s"]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  plots.main([str(tmp_path)])
  out = capsys.readouterr().out.splitlines()
  assert out[-1] == "skipped (0 at every step): dropped_predictions"
  assert not (tmp_path / "plots" / "dropped_predictions.png").exists()
  assert (tmp_path / "plots" / "accuracy.png").exists()
