"""Tiny on-disk datasets and configs for the training tests."""

import pathlib

import numpy as np

from data_helpers import VOCAB, WORDS
from jaxencoder.model.config import EncoderConfig
from jaxencoder.data import builders
from jaxencoder.train.config import base_config, model_config

TAGS = ("DET", "NOUN", "VERB")


def write_vocab(root: pathlib.Path) -> pathlib.Path:
  path = root / "vocab.txt"
  path.write_text("\n".join(VOCAB) + "\n")
  return path


def text_corpus(root: pathlib.Path, docs: int = 120, distinct: int | None = None,
                name: str = "corpus") -> str:
  """A prepared text_corpus of random sentences (or `distinct` ones repeated); its dir."""
  rng = np.random.default_rng(0)
  src = root / name
  src.mkdir(parents=True)
  pool = [" ".join(rng.choice(WORDS, size=rng.integers(3, 12)))
          for _ in range(distinct or docs)]
  paragraphs = [pool[i % len(pool)] for i in range(docs)]
  (src / "a.txt").write_text("\n\n".join(paragraphs) + "\n")
  return str(builders.prepare("text_corpus", src, root / "tfds", name=name))


def classification_set(root: pathlib.Path) -> str:
  """Label = whether 'cat' occurs: learnable from tokens."""
  rng = np.random.default_rng(1)
  src = root / "cls"
  src.mkdir(parents=True)
  for split, n in (("train", 64), ("test", 16)):
    rows = ["text,label"]
    for _ in range(n):
      words = list(rng.choice(WORDS, size=6))
      rows.append(f"{' '.join(words)},{'yes' if 'cat' in words else 'no'}")
    (src / f"{split}.csv").write_text("\n".join(rows) + "\n")
  return str(builders.prepare("text_classification", src, root / "tfds", name="cls"))


def tagged_set(root: pathlib.Path) -> str:
  rng = np.random.default_rng(2)
  src = root / "tags"
  src.mkdir(parents=True)
  lines = [" ".join(f"{w}/{rng.choice(TAGS)}" for w in rng.choice(WORDS, size=5))
           for _ in range(40)]
  (src / "train.txt").write_text("\n".join(lines) + "\n")
  return str(builders.prepare("tagged_tokens", src, root / "tfds", name="tags"))


def image_set(root: pathlib.Path) -> str:
  rng = np.random.default_rng(3)
  src = root / "img"
  src.mkdir(parents=True)
  for split, n in (("train", 32), ("test", 8)):
    np.savez(src / f"{split}.npz", images=rng.integers(0, 255, (n, 8, 8), dtype=np.uint8),
             labels=rng.integers(0, 3, n))
  return str(builders.prepare("image_arrays", src, root / "tfds", name="img"))


def series_set(root: pathlib.Path) -> str:
  rng = np.random.default_rng(4)
  src = root / "ts"
  src.mkdir(parents=True)
  for split, n in (("TRAIN", 24), ("TEST", 8)):
    lines = ["@problemName toy", "@univariate true", "@classLabel true a b", "@data"]
    for _ in range(n):
      label = rng.choice(["a", "b"])
      values = rng.normal(size=12) + (1.0 if label == "a" else -1.0)
      lines.append(",".join(f"{v:.3f}" for v in values) + f":{label}")
    (src / f"toy_{split}.ts").write_text("\n".join(lines) + "\n")
  return str(builders.prepare("time_series", src, root / "tfds", name="toy"))


def tiny_config(root: pathlib.Path, source: str, vocab: pathlib.Path, **model_overrides):
  """A 2-layer 32-wide MLM config over the tiny vocab; a few fast steps."""
  c = base_config()
  fields = dict(vocab_size=len(VOCAB), num_layers=2, emb_dim=32, num_heads=4, mlp_dim=64,
                max_len=32)
  fields.update(model_overrides)
  c.model = model_config(EncoderConfig(**fields))
  c.data.source = source
  c.data.data_dir = str(root)
  c.data.tokenizer = str(vocab)
  c.data.seq_len = 16
  c.data.holdout_every = 10
  c.batch_size = 8
  c.eval_batch_size = 8
  c.num_train_steps = 6
  c.log_every = 1
  c.eval_every = 3
  c.checkpoint_every = 3
  c.optim.learning_rate = 3e-3
  c.optim.warmup_steps = 1
  c.progress_bar = False
  return c


def train_losses(workdir) -> list[float]:
  """The train loss of every logged step of a run, in order."""
  from jaxencoder.train.metrics import read_metrics
  return [r["loss"] for r in read_metrics(workdir) if r["split"] == "train"]


def final_params(config, workdir):
  """The params of the latest checkpoint in workdir, on the host."""
  import jax
  from jaxencoder.train.init_from import finalized
  from jaxencoder.train.loop import setup
  run = setup(finalized(config), workdir)
  params = jax.device_get(run.state.params)
  run.checkpointer.close()
  run.writer.close()
  return params


def corpus_overrides(root: pathlib.Path) -> dict:
  """--config.* overrides that point train.py at a tiny prepared corpus and vocab."""
  return {"data.source": text_corpus(root), "data.data_dir": root,
          "data.tokenizer": write_vocab(root), "model.vocab_size": len(VOCAB)}
