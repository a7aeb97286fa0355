"""Adding a data kind is one module and one registry line: tests/lines_kind.py, registered
here, is prepared, has its own data.* key, makes the batches batch_shapes promises through
make_pipelines, and trains."""

import numpy as np
import pytest

import lines_kind
import train_helpers as th
from data_helpers import WORDS
from jaxencoder.data import builders, kinds
from jaxencoder.io.checkpoint import to_json
from jaxencoder.train.batch_shapes import batch_shapes
from jaxencoder.train.config import apply_overrides, base_config, finalize
from jaxencoder.train.datasets import make_pipelines
from jaxencoder.train.loop import train_and_evaluate
from jaxencoder.train.metrics import read_metrics
from jaxencoder.train.resume import config_changes


@pytest.fixture
def registered(monkeypatch):
  monkeypatch.setattr(kinds, "KINDS", list(kinds.KINDS))
  kinds.register(lines_kind.KIND)  # the one registry line
  yield lines_kind.KIND


def lines_set(root) -> str:
  """Label = whether 'cat' occurs: learnable from tokens."""
  rng, src = np.random.default_rng(0), root / "lines"
  src.mkdir()
  for split, n in (("train", 48), ("test", 16)):
    rows = []
    for _ in range(n):
      words = list(rng.choice(WORDS, size=5))
      rows.append(f"{'cat' if 'cat' in words else 'other'}\t{' '.join(words)}")
    (src / f"{split}.lines").write_text("\n".join(rows) + "\n")
  return str(builders.prepare("labelled_lines", src, root / "tfds", name="lines"))


def lines_config(root):
  config = th.tiny_config(root, lines_set(root), th.write_vocab(root), num_layers=1)
  config.task, config.data.kind, config.data.eval_split = "classify", "labelled_lines", "test"
  return config


def test_its_option_is_a_data_key_with_its_default(registered):
  config = base_config()
  assert config.data.line_weight == 1.0
  apply_overrides(config, ["data.line_weight=0.5"])
  assert config.data.line_weight == 0.5


def test_its_pipeline_makes_the_batches_its_shapes_promise(registered, tmp_path):
  config = lines_config(tmp_path)
  config.data.line_weight = 0.5
  config = finalize(config)
  made = make_pipelines(config)
  assert made.label_names == ["cat", "other"] and made.num_classes == 2
  for batch, train in ((next(iter(made.train)), True), (next(iter(made.make_eval())), False)):
    size = config.batch_size if train else config.eval_batch_size
    shapes = batch_shapes(config, size, train=train)
    assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
        k: (shape, np.dtype(dtype)) for k, (shape, dtype) in shapes.items()}
    assert set(np.unique(batch["example_weights"])) <= {0.0, 0.5}
    assert batch["example_weights"].max() == 0.5


def test_a_run_saved_before_the_kind_was_added_resumes_at_its_default(registered):
  """A saved config lacking the new kind's key compares as if it had its default."""
  config = finalize(base_config())
  saved = to_json(config)
  del saved["data"]["line_weight"]
  assert config_changes(saved, config) == ([], [])


def test_a_taken_name_and_an_unknown_kind_are_refused(registered):
  with pytest.raises(ValueError, match="data kind 'labelled_lines' is already registered"):
    kinds.register(lines_kind.LabelledLinesKind())
  with pytest.raises(ValueError, match="data.kind='labeled_lines' is not one of .*labelled_lines"):
    kinds.kind_of("labeled_lines")


@pytest.mark.slow
def test_a_new_kind_trains_and_evaluates(registered, tmp_path):
  config = lines_config(tmp_path)
  config.num_train_steps = 3
  train_and_evaluate(finalize(config), tmp_path / "run")
  evals = [r for r in read_metrics(tmp_path / "run") if r["split"] == "eval"]
  assert np.isfinite(evals[-1]["loss"]) and 0.0 <= evals[-1]["f1_macro"] <= 1.0
