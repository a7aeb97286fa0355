"""bench/results.py without training: the docstring command of real configs, each config's
RESULT, the metric read from metrics.jsonl rows, the verdict and the table."""

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import results  # noqa: E402


def config_text(name):
  return (REPO / "configs" / f"{name}.py").read_text(encoding="utf-8")


def declared(values=(0.95, 0.91, 0.99), spread=0.03, overrides=(), name="gun"):
  return results.Declared(name, "test_accuracy", tuple(values), spread, tuple(overrides))


def test_a_plain_docstring_command_adds_no_flags():
  assert results.docstring_command("time_series", config_text("time_series")) == []


def test_flags_on_a_continued_docstring_command_are_read():
  assert results.docstring_command("mlm_bert_base", config_text("mlm_bert_base")) == [
      "--config.data.source=text_corpus/MYCORPUS", "--config.data.data_dir=gs://BUCKET/data"]


def test_a_docstring_without_the_command_is_refused():
  with pytest.raises(ValueError, match="configs/x.py: the docstring gives no"):
    results.docstring_command("x", '"""Trains something."""\n')


def test_every_config_declares_its_result_or_why_it_is_not_scored_here():
  found, unscored = results.declared_configs([])
  assert {"time_series", "vit_fashion_mnist", "classify", "seq2seq"} <= {d.name for d in found}
  names = [d.name for d in found] + [u.split(" (")[0] for u in unscored]
  assert sorted(names) == sorted(p.stem for p in (REPO / "configs").glob("*.py"))
  assert [u.split(" (")[0] for u in unscored] == [
      "mlm_bert_base", "modernbert_base", "modernbert_base_long"]
  assert all("docs/performance.md" in u for u in unscored), unscored
  for d in found:
    assert d.values and d.spread > 0 and all(0 <= v < 100 for v in d.values), d  # a rate or a loss
    results.docstring_command(d.name, config_text(d.name))


def test_a_named_config_that_is_not_scored_here_says_why():
  with pytest.raises(SystemExit, match="configs/mlm_bert_base.py declares no RESULT: it is "
                     "not scored here, sized for"):
    results.declared_configs(["mlm_bert_base"])


def test_a_config_declaring_neither_result_nor_reason_is_refused(tmp_path, monkeypatch):
  (tmp_path / "configs").mkdir()
  (tmp_path / "configs" / "new.py").write_text('"""A new config."""\n')
  monkeypatch.setattr(results, "REPO", tmp_path)
  with pytest.raises(SystemExit, match=r"configs/new.py declares no RESULT \(add RESULT = "):
    results.declared_configs([])


def test_result_written_as_a_dict_call_reads_with_its_overrides():
  text = ('"""x"""\nRESULT = dict(metric="accuracy", values=(0.9, 0.8), spread=0.05,\n'
          '              overrides=("num_train_steps=20",))\n')
  assert results.declared_result("x", text) == results.Declared(
      "x", "accuracy", (0.9, 0.8), 0.05, ("num_train_steps=20",))
  assert results.declared_result("x", '"""x"""\nOTHER = 1\n') is None


ROWS = [
    {"step": 100, "split": "train", "accuracy": 0.5},
    {"step": 100, "split": "eval", "accuracy": 0.7, "loss": 1.0},
    {"step": 200, "split": "eval", "accuracy": 0.8, "loss": 0.5},
    {"step": 200, "split": "test", "accuracy": 0.75},
]


def test_test_metrics_come_from_the_test_row_others_from_the_last_eval():
  assert results.read_metric(ROWS, "test_accuracy") == 0.75
  assert results.read_metric(ROWS, "accuracy") == 0.8
  assert results.read_metric(ROWS, "loss") == 0.5


def test_a_metric_the_run_did_not_log_names_what_it_logged():
  with pytest.raises(KeyError, match="no 'test_f1' .*'eval:accuracy'"):
    results.read_metric(ROWS, "test_f1")


def test_documented_value_is_the_mean_of_the_seeds_run():
  d = declared()
  assert d.documented(3) == pytest.approx((0.95, 0.91, 0.99))
  assert d.documented(1) == pytest.approx((0.95, 0.95, 0.95))
  assert d.documented(5) == pytest.approx((0.95, 0.91, 0.99))  # more than documented: all


def test_a_mean_within_spread_passes_even_when_one_seed_is_outside():
  m = results.Measured(declared(), (0.90, 0.97, 0.96), (1.0, 1.0, 1.0))
  assert m.mean == pytest.approx(0.9433, abs=1e-4) and m.ok
  assert results.flags([m]) == []


def test_a_mean_outside_spread_is_flagged_with_its_drift():
  m = results.Measured(declared(), (0.867,), (1.0,))
  assert not m.ok and m.drift == pytest.approx(-0.083)
  assert results.flags([m]) == [
      "gun: test_accuracy 0.8670 left the documented 0.9500 by -0.0830 (spread ±0.03)"]


def test_the_spread_edge_counts_as_within():
  assert results.Measured(declared(spread=0.05), (0.90,), (1.0,)).ok


def test_the_table_shows_documented_and_measured_ranges_and_verdicts():
  ok = results.Measured(declared(), (0.94, 0.96, 0.98), (60.0, 120.0, 180.0))
  bad = results.Measured(declared(values=(0.90,), spread=0.01, overrides=("num_train_steps=20",)),
                         (0.85,), (30.0,))
  text = results.table([ok, bad], "Measured today.", "2026-12-05, load 2.0")
  lines = text.splitlines()
  assert lines[0].startswith("| config | metric | documented | measured | spread | verdict")
  assert lines[2] == ("| `gun.py` | test_accuracy | 0.9500 (0.9100-0.9900, 3 seeds) | "
                      "0.9600 (0.9400-0.9800, 3 seeds) | ±0.03 | ok | 2.0 min | "
                      "2026-12-05, load 2.0 |")
  assert lines[3] == ("| `gun.py` `--config.num_train_steps=20` | test_accuracy | 0.9000 | "
                      "0.8500 | ±0.01 | **drifted** (-0.0500) | 0.5 min | 2026-12-05, load 2.0 |")
  assert lines[-1] == "Measured today."


def test_a_subset_run_updates_its_rows_and_keeps_the_others():
  old = results.table([results.Measured(declared(name="a"), (0.9,), (60.0,)),
                       results.Measured(declared(name="b"), (0.8,), (60.0,))], "old", "day 1")
  new = results.table([results.Measured(declared(name="b"), (0.7,), (60.0,))], "new", "day 2")
  lines = results.merged(old, new).splitlines()
  assert [line.split("`")[1] for line in lines[2:4]] == ["a.py", "b.py"]
  assert lines[2].endswith("| day 1 |") and lines[3].endswith("| day 2 |")
  assert "0.7000" in lines[3] and lines[-1] == "new"
  assert results.merged("", new) == new
  # A subset run read only its configs: the whole table's note (e.g. what is not scored) stays.
  kept = results.merged(old, new, keep_note=True).splitlines()
  assert kept[:4] == lines[:4] and kept[-1] == "old"
  assert results.merged("", new, keep_note=True) == new
