"""Adding a task is one module and one registry line: tests/length_task.py, registered
here, trains, evaluates, keeps its best checkpoint by its own metric and predicts."""

import pytest

import length_task
import train_helpers as th
from jaxencoder.tasks import registry
from jaxencoder.train import predict
from jaxencoder.train.config import base_config, finalize
from jaxencoder.train.loop import train_and_evaluate
from jaxencoder.train.metrics import read_metrics


@pytest.fixture
def registered(monkeypatch):
  monkeypatch.setattr(registry, "TASK_FAMILIES", list(registry.TASK_FAMILIES))
  registry.register(length_task.FAMILY)  # the one registry line
  yield length_task.FAMILY


@pytest.mark.slow
def test_a_new_task_trains_evaluates_and_predicts(registered, tmp_path):
  config = th.tiny_config(tmp_path, th.text_corpus(tmp_path), th.write_vocab(tmp_path),
                          num_layers=1)
  config.task, config.length_scale, config.best_metric = "text_length", 2.0, "abs_error"
  config.optim.learning_rate, config.num_train_steps = 3e-3, 20  # 0.05 oscillated
  train_and_evaluate(finalize(config), tmp_path / "run")
  train = [r for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
  evals = [r for r in read_metrics(tmp_path / "run") if r["split"] == "eval"]
  first, last = (sum(r["loss"] for r in rows) for rows in (train[:3], train[-3:]))
  assert last < first / 2, [r["loss"] for r in train]  # the head learns the targets' scale
  assert {"loss", "abs_error"} <= set(evals[-1]) and "accuracy" not in evals[-1]
  out = predict.predict(predict.load(tmp_path / "run"), ["the cat sat", "a dog"])
  assert [line.split("\t")[1] for line in out] == ["the cat sat", "a dog"]
  assert all(float(line.split("\t")[0]) == pytest.approx(float(line.split("\t")[0]))
             for line in out)


def test_its_options_are_config_keys_checked_by_the_task(registered):
  config = base_config()
  assert config.length_scale == 1.0
  config.task, config.length_scale = "text_length", -1.0
  with pytest.raises(ValueError, match="length_scale must be positive"):
    finalize(config)
  assert registered.metric_mode("abs_error") == "min"


def test_a_taken_name_and_an_unknown_task_are_refused(registered):
  with pytest.raises(ValueError, match=r"task names \['text_length'\] are already registered"):
    registry.register(length_task.TextLength())
  config = base_config()
  config.task = "text_lenght"
  with pytest.raises(ValueError, match="task='text_lenght' is not one of .*'text_length'"):
    finalize(config)
