"""Predictions of a train.py run for a file of inputs: classes, tags or embeddings.

  jaxencoder-predict --run RUN_DIR --input FILE [--out FILE] [--step N]

By the run's task (read from the config stored with its checkpoint):
  classify        one text per line ("text<TAB>text_b" for pairs) -> "label<TAB>line"
  token_classify  one sentence of space-separated words per line -> "word/TAG ..."
  mlm, mlm_nsp, mlm_sop, electra (its discriminator), contrastive
                  one text per line -> OUT (.npy): pooled encoder vectors [N, D]
Text runs only; labels are named from the run's prepared dataset when it is still
there, else printed as class indices.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import flax.linen as nn
import ml_collections
import numpy as np

from jaxencoder import cli
from jaxencoder.config import EncoderConfig
from jaxencoder.encoder import ENCODER, Encoder
from jaxencoder.io.checkpoint import restore_params_only
from jaxencoder.io.run_dir import RunDir, abstract_params
from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path
from jaxencoder.train import pipelines
from jaxencoder.train.tasks import MASKED_TASKS, make_task

BATCH = 32


@dataclasses.dataclass
class Predictor:
  """A restored run: its task name, model config, task params, tokenizer and labels."""
  task: str
  cfg: EncoderConfig
  model: nn.Module
  params: dict
  tokenizer: Tokenizer
  seq_len: int
  label_names: list[str] | None


def load(run_path, step: int | None = None) -> Predictor:
  run = RunDir.open(run_path)
  config = run.read_config(step)
  cfg = EncoderConfig.from_dict(config["model"])
  if cfg.input_kind != "text":
    raise ValueError(f"{run_path}: predict reads text; this run's input_kind is {cfg.input_kind!r}")
  names = _label_names(config)
  task = make_task(config["task"], cfg, num_classes=len(names) if names else config["num_classes"],
                   projection_dim=config["projection_dim"])
  params = restore_params_only(run.checkpoint_dir, abstract_params(cfg, task.model),
                               subtree=("params",),
                               step=step if step is not None else run.latest_step())
  tokenizer = Tokenizer.from_file(run.tokenizer_path() or default_tokenizer_path())
  seq_len = min(config["data"]["seq_len"], cfg.max_len)
  return Predictor(config["task"], cfg, task.model, params, tokenizer, seq_len, names)


def _label_names(config: dict) -> list[str] | None:
  """Class names from the run's prepared dataset, if it can still be opened."""
  data = ml_collections.ConfigDict(config["data"])
  try:
    return pipelines.label_names(data, data.source)
  except Exception:  # the dataset moved or was deleted: fall back to indices
    return None


def predict(p: Predictor, lines: list[str]) -> list[str] | np.ndarray:
  """Labelled lines (classify, token_classify) or pooled vectors [N, D] (the masked
  pre-training tasks, contrastive)."""
  outputs = []
  for start in range(0, len(lines), BATCH):
    outputs.append(_predict_batch(p, lines[start:start + BATCH]))
  if p.task in ("classify", "token_classify"):
    return [line for batch in outputs for line in batch]
  return np.concatenate(outputs) if outputs else np.zeros((0, p.cfg.emb_dim), np.float32)


def _predict_batch(p: Predictor, lines: list[str]):
  name = lambda i: p.label_names[i] if p.label_names else str(i)
  if p.task == "token_classify":
    words = [line.split() for line in lines]
    batch = p.tokenizer.encode_batch(words, max_length=p.seq_len, is_pretokenized=True)
  else:
    pairs = [line.split("\t", 1) for line in lines]
    texts_b = [pair[1] if len(pair) > 1 else "" for pair in pairs]
    has_b = any(len(pair) > 1 for pair in pairs)
    batch = p.tokenizer.encode_batch([pair[0] for pair in pairs], texts_b if has_b else None,
                                     max_length=p.seq_len)
  args = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
  if p.task in MASKED_TASKS or p.task == "contrastive":
    encoder_params = p.params[ENCODER] if ENCODER in p.params else p.params
    out = Encoder(p.cfg).apply({"params": encoder_params}, *args)
    return np.asarray(out.pooled, np.float32)
  logits = np.asarray(p.model.apply({"params": p.params}, *args))
  if p.task == "classify":
    return [f"{name(int(c))}\t{line}" for c, line in zip(logits.argmax(-1), lines)]
  tags_BxL = logits.argmax(-1)
  first_BxW = batch["first_subword_index"]
  return [" ".join(f"{w}/{name(int(tags_BxL[b, first_BxW[b, i]]))}"
                   for i, w in enumerate(ws) if i < first_BxW.shape[1] and first_BxW[b, i] >= 0)
          for b, ws in enumerate(words)]


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(prog="jaxencoder-predict", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--run", required=True, help="a train.py workdir (local or gs://)")
  parser.add_argument("--input", required=True, help="a text file, one input per line")
  parser.add_argument("--out", help="output file (default: stdout; .npy for embeddings)")
  parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
  args = parser.parse_args(argv)
  cli.run_main(lambda: _main(args))


def _main(args) -> None:
  lines = [line for line in pathlib.Path(args.input).read_text(encoding="utf-8").splitlines()
           if line.strip()]
  p = load(args.run, args.step)
  result = predict(p, lines)
  if isinstance(result, np.ndarray):
    out = pathlib.Path(args.out or "embeddings.npy")
    np.save(out, result)
    print(f"wrote {out}: {result.shape[0]} x {result.shape[1]} pooled vectors")
  elif args.out:
    pathlib.Path(args.out).write_text("".join(line + "\n" for line in result), encoding="utf-8")
    print(f"wrote {args.out}: {len(result)} predictions")
  else:
    print("\n".join(result))


if __name__ == "__main__":
  main()
