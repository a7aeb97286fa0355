"""Every configs/*.py runs: its docstring's train.py command, with tiny overrides (a
1-layer, 32-wide model, short rows, one step: train, eval, save, predict) on data of the
config's kind made here.

A new config is picked up automatically; one whose data kind or task has no maker
below fails here instead of rotting unnoticed.
"""

import pathlib
import re

import numpy as np
import pytest

import train_helpers as th
from conftest import fast_first
from jaxencoder.data import beir, kinds
from jaxencoder.train import datasets as pipelines, predict
from jaxencoder.train.config_file import load_config
from jaxencoder.tasks import registry
from jaxencoder.train.config import apply_overrides, resolved_task
from jaxencoder.train.loop import train_and_evaluate
from jaxencoder.train.metrics import read_metrics
from test_heads_tasks import task_source

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = sorted(p.stem for p in (REPO / "configs").glob("*.py") if p.stem != "__init__")
TINY = ["model.num_layers=1", "model.emb_dim=32", "model.num_heads=4", "model.mlp_dim=64",
        "model.max_len=32", "batch_size=8", "eval_batch_size=8", "num_train_steps=1",
        "log_every=1", "eval_every=1", "checkpoint_every=1", "optim.warmup_steps=1",
        "progress_bar=false", "init_from="]


def data_overrides(config, root: pathlib.Path) -> list[str]:
  """Overrides pointing the config at a tiny dataset of its kind (and task) made here."""
  kind, task = config.data.kind, resolved_task(config)
  vocab = th.write_vocab(root)
  text = [f"model.vocab_size={len(th.VOCAB)}", f"data.tokenizer={vocab}", "data.seq_len=16"]
  if kind == "text_corpus":
    source, extra = th.text_corpus(root), text
    if task == "seq2seq":
      extra = extra + ["data.max_words=6"]
  elif kind == "text_classification":
    source, extra = th.classification_set(root), text + ["data.eval_split=test"]
  elif kind == "tagged_tokens":
    source, extra = th.tagged_set(root), text + ["data.eval_split="]
  elif kind == "text_records":
    source, extra = task_source(root, task), text
  elif kind == "image_arrays":  # 8 x 8 x 1 images, 3 classes
    source, extra = th.image_set(root), ["data.eval_split=test", "model.image_size=(8, 8)",
                                         "model.patch_size=1", "model.num_channels=1"]  # the stem: 4x4 pixels a token
  elif kind == "time_series":  # 12 steps, 1 channel, 2 classes
    source, extra = th.series_set(root), ["data.eval_split=test", "data.seq_len=12",
                                          "model.input_features=1"]
  else:
    raise AssertionError(f"no tiny data maker for data.kind={kind!r}: add one here")
  if config.get("eval_retrieval"):  # a tiny BEIR set instead of the config's (fetched) one
    words = th.WORDS
    beir.write(root / "beir", {f"q{i}": f"{words[i]} {words[i + 1]}" for i in range(4)},
               {f"d{i}": f"{words[i + 1]} {words[i + 2]}" for i in range(6)},
               {f"q{i}": {f"d{i}": 1} for i in range(4)})
    extra = extra + [f"eval_retrieval={root / 'beir'}"]
  return [f"data.source={source}", f"data.data_dir={root}", *extra]


# make test runs the default config (make train's); make test-slow runs every other one.
@pytest.mark.parametrize("name", fast_first(sorted(CONFIGS, key=lambda name: name != "mlm_tiny")))
def test_config_runs_its_docstring_command_with_tiny_overrides(tmp_path, name):
  path = REPO / "configs" / f"{name}.py"
  doc = path.read_text(encoding="utf-8")
  command = re.search(rf"python train\.py --config configs/{name}\.py --workdir (\S+)", doc)
  assert command, f"configs/{name}.py: the docstring gives no `python train.py --config ...` command"
  config = load_config(str(path))
  apply_overrides(config, TINY + data_overrides(config, tmp_path))
  metrics = train_and_evaluate(config, tmp_path / "run")
  assert np.isfinite(metrics["loss"]), metrics
  rows = read_metrics(tmp_path / "run")
  if config.eval_retrieval:
    assert 0 <= [r for r in rows if r["split"] == "eval"][0]["ndcg@10"] <= 1
  assert [r["step"] for r in rows if r["split"] == "train"] == [1]
  assert [r["step"] for r in rows if r["split"] == "eval"] == [1]
  assert (tmp_path / "run" / "checkpoints" / "1").is_dir()
  check_predict(config, tmp_path / "run")


def check_predict(config, run) -> None:
  """What jaxencoder-predict makes of a text run, by task."""
  task = resolved_task(config)
  if not kinds.kind_of(config.data.kind).text:
    return
  lines = ["the cat sat on the mat", "a dog ran"]
  predicts = registry.family_of(task).predicts.get(task)
  if predicts is None:
    with pytest.raises(ValueError, match=f"predict does not support task '{task}'"):
      predict.load(run)
    return
  out = predict.predict(predict.load(run), lines)
  if predicts == "vectors":  # pre-training, contrastive: pooled vectors
    assert out.shape == (2, config.model.emb_dim)
    return
  if task == "token_classify":  # "word/TAG ..." per line
    assert [" ".join(t.rsplit("/", 1)[0] for t in o.split()) for o in out] == lines
    return
  assert [o.split("\t", 1)[1] for o in out] == lines
  if task == "regression":
    assert all(np.isfinite(float(o.split("\t")[0])) for o in out)
  elif task == "multilabel":
    names = set(pipelines.label_names(config.data, config.data.source))
    assert all(set(filter(None, o.split("\t")[0].split(","))) <= names for o in out)
