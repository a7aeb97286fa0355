"""Training controls: the run's length in epochs, early stopping on best_metric (exact
across a kill and resume) and load_best_at_end (the final eval, test, predict and convert
take the best checkpoint)."""

import jax
import numpy as np
import pytest

import train_helpers as th
from jaxencoder.io.run_dir import RunDir
from jaxencoder.model.encoder import ENCODER
from jaxencoder.pretrained.convert import restore_for_export
from jaxencoder.train.config import apply_overrides, base_config, finalize, resolve_length
from jaxencoder.train.datasets import train_examples
from jaxencoder.train.early_stopping import Patience, replayed
from jaxencoder.train.metrics import read_metrics


def epochs_config(epochs=3.0, batch=8, accum=2):
  config = base_config()
  config.num_train_steps, config.num_train_epochs = 0, epochs
  config.batch_size, config.optim.grad_accum_steps = batch, accum
  return config


def never_counted():
  raise AssertionError("the recorded count should have been used")


def test_epochs_resolve_to_whole_steps_of_batch_times_accumulation_rows_rounded_up():
  config = epochs_config()
  resolve_length(config, lambda: 100)
  assert (config.num_train_steps, config.train_examples) == (19, 100)  # ceil(300 / 16)
  assert finalize(config).optim.total_steps == 19  # the schedule follows the resolved count


def test_a_resume_resolves_the_count_its_run_recorded():
  config = epochs_config()
  resolve_length(config, never_counted, {"train_examples": 90, "num_train_epochs": 3.0})
  assert config.num_train_steps == 17  # ceil(270 / 16), whatever the data holds now


def test_a_resolved_config_resolves_to_itself():
  config = epochs_config()
  resolve_length(config, lambda: 100)
  resolve_length(config, never_counted)  # a saved config: both set, train_examples known
  assert config.num_train_steps == 19


def test_steps_and_epochs_both_set_is_one_error():
  config = epochs_config()
  config.num_train_steps = 50
  with pytest.raises(ValueError, match=r"num_train_steps=50 and num_train_epochs=3.0 both set "
                                       r"the run's length: set the other one to 0"):
    resolve_length(config, never_counted)


@pytest.mark.parametrize("given, steps, epochs", [
    (["num_train_steps=50"], 50, 0.0), (["num_train_epochs=2"], 0, 2.0)])
def test_a_length_given_on_the_command_line_replaces_the_configs_other(given, steps, epochs):
  config = epochs_config() if "steps" in given[0] else base_config()
  apply_overrides(config, given)
  assert (config.num_train_steps, config.num_train_epochs) == (steps, epochs)


def test_both_lengths_on_the_command_line_stay_both_and_are_refused():
  config = base_config()
  apply_overrides(config, ["num_train_steps=50", "num_train_epochs=2"])
  with pytest.raises(ValueError, match="both set"):
    resolve_length(config, never_counted)


def test_epochs_over_a_text_corpus_are_refused_in_one_line():
  with pytest.raises(ValueError, match="data.kind=text_corpus cuts and packs documents into "
                                       "rows.*set num_train_steps instead"):
    train_examples(epochs_config())


@pytest.mark.parametrize("overrides, message", [
    (dict(num_train_steps=0), "num_train_steps=0 and num_train_epochs=0: set the run's length"),
    (dict(num_train_epochs=-1.0), "num_train_epochs must be >= 0"),
    (dict(early_stopping_patience=-1), "early_stopping_patience must be 0 .off. or a positive"),
    (dict(load_best_at_end=True, eval_every=100, checkpoint_every=150),
     "load_best_at_end needs every eval saved: eval_every=100 must be a multiple of "
     "checkpoint_every=150"),
])
def test_invalid_training_controls_are_one_line_naming_the_key(overrides, message):
  config = base_config()
  config.update(overrides)
  with pytest.raises(ValueError, match=message):
    finalize(config)


def test_patience_counts_evals_since_a_strictly_better_one():
  patience = Patience("accuracy", "max", 2)
  for step, value in ((2, 0.5), (4, 0.7), (6, 0.7), (8, 0.6)):  # a tie does not improve
    patience.update(step, {"accuracy": value})
  assert (patience.best_step, patience.waited, patience.exhausted) == (4, 2, True)


def test_patience_replays_the_eval_rows_up_to_the_restored_step():
  rows = [{"step": s, "split": split, "loss": v}
          for s, v in ((2, 0.9), (4, 0.5), (6, 0.6), (8, 0.4)) for split in ("train", "eval")]
  at_6 = replayed(rows[::-1], Patience("loss", "min", 2), upto=6)
  assert (at_6.best_step, at_6.best, at_6.waited) == (4, 0.5, 1)
  assert replayed(rows, Patience("loss", "min", 2), upto=8).waited == 0


def test_a_resume_may_change_the_training_controls():
  from jaxencoder.io.checkpoint import to_json
  from jaxencoder.train.resume import config_changes
  saved = finalize(base_config())
  current = base_config()
  current.num_train_epochs, current.train_examples = 2.0, 64
  current.early_stopping_patience, current.load_best_at_end = 3, True
  allowed, structural = config_changes(to_json(saved), finalize(current))
  assert structural == [] and len(allowed) == 4


# Scripted eval losses by step: best at 4, then none better at 6 and 8 (patience 2).
SCRIPTED = {2: 0.9, 4: 0.5, 6: 0.6, 8: 0.55, 10: 0.4, 12: 0.3}


class Killed(BaseException):
  """A kill during the eval at step 8: nothing after step 6's checkpoint is saved."""


def classify_config(root, vocab, source):
  """Classify-style: 48 train reviews (1 in 4 of the 64 held out as validation), 2 epochs
  of 8 rows a step: 12 steps; an eval and a save every 2 steps; test scored at the end."""
  config = th.tiny_config(root, source, vocab, num_layers=1)
  config.task, config.data.kind = "classify", "text_classification"
  config.data.eval_split, config.data.holdout_every, config.data.test_split = "", 4, "test"
  config.num_train_steps, config.num_train_epochs = 0, 2.0
  config.eval_every = config.checkpoint_every = 2
  config.keep_checkpoints, config.log_every = 1, 2
  config.early_stopping_patience, config.load_best_at_end = 2, True
  return config


def scripted_evaluate(monkeypatch, kill_at=None):
  """loop.evaluate with SCRIPTED eval losses (the test split evaluated for real); the
  (step, encoder params) of each scripted eval."""
  from jaxencoder.train import loop
  real, seen = loop.evaluate, []
  def evaluate(run, eval_step, signals=None, *, make_batches=None):
    if make_batches is not None:
      return real(run, eval_step, signals, make_batches=make_batches)
    step = int(run.state.step)
    if step == kill_at:
      raise Killed()
    seen.append((step, jax.device_get(run.state.params[ENCODER])))
    return {"loss": SCRIPTED[step], "accuracy": 0.5}
  monkeypatch.setattr(loop, "evaluate", evaluate)
  return seen


@pytest.fixture(scope="module")
def reviews(tmp_path_factory):
  root = tmp_path_factory.mktemp("reviews")
  return root, th.write_vocab(root), th.classification_set(root)


@pytest.mark.slow
def test_epochs_stop_early_and_the_best_checkpoint_is_evaluated_at_the_end(
    reviews, tmp_path, monkeypatch, caplog):
  from jaxencoder.train.loop import train_and_evaluate
  seen = scripted_evaluate(monkeypatch)
  run = tmp_path / "run"
  with caplog.at_level("INFO", logger="jaxencoder"):
    metrics = train_and_evaluate(classify_config(*reviews), run)
  saved = RunDir(run).read_config()
  assert (saved["train_examples"], saved["num_train_steps"]) == (48, 12)
  assert saved["optim"]["total_steps"] == 12
  rows = read_metrics(run)
  assert [r["step"] for r in rows if r["split"] == "eval"] == [2, 4, 6, 8]  # stopped at 8
  assert max(r["step"] for r in rows if r["split"] == "train") == 8
  assert RunDir(run).latest_step() == 8
  # the final eval, the test row and readers (predict, convert) take step 4
  (final_step, final_params), = seen[4:]
  assert final_step == 4 and metrics["loss"] == SCRIPTED[4]
  _, best = restore_for_export(RunDir(run), step=4)
  jax.tree.map(np.testing.assert_array_equal, final_params, jax.device_get(best))
  assert [r["step"] for r in rows if r["split"] == "test"] == [4]
  assert RunDir(run).default_step() == 4
  _, default = restore_for_export(RunDir(run))
  jax.tree.map(np.testing.assert_array_equal, best, default)
  said = caplog.text
  assert "num_train_epochs=2: 12 steps (48 train examples x 2 / 8 rows a step" in said
  assert "early stopping at step 8 of 12: eval loss has not improved on 0.5 (step 4)" in said
  assert "load_best_at_end: step 4, best on eval loss (0.5)" in said
  # A rerun: done, says why, nothing set up, evaluated or written; the metrics it returned
  from jaxencoder.train import loop
  written = (run / "metrics.jsonl").read_bytes()
  monkeypatch.setattr(loop, "setup", lambda *args, **kwargs: pytest.fail("set up again"))
  caplog.clear()
  with caplog.at_level("INFO", logger="jaxencoder"):
    assert train_and_evaluate(classify_config(*reviews), run) == metrics
  assert f"{run} is done at step 8 of 12, stopped early: eval loss has not improved" in caplog.text
  assert (run / "metrics.jsonl").read_bytes() == written


@pytest.mark.slow
def test_a_killed_run_resumes_with_its_count_of_evals_without_improvement(
    reviews, tmp_path, monkeypatch):
  """Killed during step 8's eval, resumed from step 6: it stops at step 8, as the
  uninterrupted run did (a count that restarted at 0 would train on to step 12)."""
  from jaxencoder.train.loop import train_and_evaluate
  run, config = tmp_path / "run", classify_config(*reviews)
  scripted_evaluate(monkeypatch, kill_at=8)
  with pytest.raises(Killed):
    train_and_evaluate(config, run)
  assert RunDir(run).latest_step() == 6
  scripted_evaluate(monkeypatch)
  metrics = train_and_evaluate(config, run)
  rows = read_metrics(run)
  assert [r["step"] for r in rows if r["split"] == "eval"] == [2, 4, 6, 8]
  assert RunDir(run).latest_step() == 8 and metrics["loss"] == SCRIPTED[4]
  assert RunDir(run).read_config()["num_train_steps"] == 12
