"""Predictions of a train.py run for a file of inputs: classes, tags or embeddings.

  jaxencoder-predict --run RUN_DIR --input FILE [--out FILE] [--step N]

By the run's task (read from the config stored with its checkpoint):
  classify        one text per line ("text<TAB>text_b" for pairs) -> "label<TAB>line"
  multilabel      one text per line -> "label,label,...<TAB>line" (sigmoid > 0.5)
  regression      one text per line ("text<TAB>text_b" for pairs) -> "value<TAB>line"
  token_classify  one sentence of space-separated words per line -> "word/TAG ..."
  seq2seq         one input text per line -> "greedy output<TAB>line" (key/value cache)
  mlm (+ sentence_pair), electra (its discriminator), contrastive
                  one text per line -> OUT (.npy): pooled encoder vectors [N, D]
Text runs only; span and multiple_choice runs are not supported (their eval metrics are
in the run's metrics.jsonl). Labels are named from the run's prepared dataset when it
is still there, else printed as class indices.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxencoder import cli
from jaxencoder.config import EncoderConfig
from jaxencoder.encoder import ENCODER, Encoder
from jaxencoder.io.checkpoint import restore_params_only
from jaxencoder.io.run_dir import RunDir, abstract_params
from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path
from jaxencoder.train import pipelines
from jaxencoder.decoder import greedy_decode
from jaxencoder.train.config import resolved_task
from jaxencoder.train.tasks import MASKED_TASKS, task_from_config

BATCH = 32
LINE_TASKS = ("classify", "multilabel", "regression", "token_classify", "seq2seq")
UNSUPPORTED = ("span", "multiple_choice")


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
  task_name = resolved_task(config)
  if task_name in UNSUPPORTED:
    raise ValueError(f"{run_path}: predict does not support task {task_name!r} (supported: "
                     "classify, multilabel, regression, token_classify, seq2seq, the masked "
                     "pre-training tasks, contrastive)")
  task = task_from_config(config, cfg, num_classes=len(names) if names else config["num_classes"])
  ids, ones = jnp.zeros((1, 8), jnp.int32), jnp.ones((1, 8), jnp.int32)
  example = ((ids, ones, ids, None, None, ids, ones)  # EncoderDecoder's init needs targets
             if task_name == "seq2seq" else None)
  params = restore_params_only(run.checkpoint_dir, abstract_params(cfg, task.model, example),
                               subtree=("params",),
                               step=step if step is not None else run.latest_step())
  tokenizer = Tokenizer.from_file(run.tokenizer_path() or default_tokenizer_path())
  seq_len = min(config["data"]["seq_len"], cfg.max_positions)
  return Predictor(task_name, cfg, task.model, params, tokenizer, seq_len, names)


def _label_names(config: dict) -> list[str] | None:
  """Class names from the run's prepared dataset, if it can still be opened."""
  data = ml_collections.ConfigDict(config["data"])
  try:
    return pipelines.label_names(data, data.source)
  except Exception:  # the dataset moved or was deleted: fall back to indices
    return None


def predict(p: Predictor, lines: list[str]) -> list[str] | np.ndarray:
  """Output lines (LINE_TASKS) or pooled vectors [N, D] (the masked pre-training tasks,
  contrastive)."""
  outputs = []
  for start in range(0, len(lines), BATCH):
    outputs.append(_predict_batch(p, lines[start:start + BATCH]))
  if p.task in LINE_TASKS:
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
  types = batch["token_type_ids"] if p.cfg.type_vocab_size else None
  args = (batch["input_ids"], batch["attention_mask"], types)
  if p.task == "seq2seq":
    tokens_BxT = greedy_decode(p.model, p.params, *args[:2], p.seq_len - 1,
                               p.tokenizer.cls_id, eos_id=p.tokenizer.sep_id,
                               token_type_ids=args[2])
    return [f"{p.tokenizer.decode(row)}\t{line}" for row, line in zip(np.asarray(tokens_BxT), lines)]
  if p.task in MASKED_TASKS or p.task == "contrastive":
    encoder_params = p.params[ENCODER] if ENCODER in p.params else p.params
    out = Encoder(p.cfg).apply({"params": encoder_params}, *args)
    return np.asarray(out.pooled, np.float32)
  logits = np.asarray(p.model.apply({"params": p.params}, *args))
  if p.task == "classify":
    return [f"{name(int(c))}\t{line}" for c, line in zip(logits.argmax(-1), lines)]
  if p.task == "regression":
    return [f"{value:.6g}\t{line}" for value, line in zip(logits[:, 0], lines)]
  if p.task == "multilabel":
    return [f"{','.join(name(int(c)) for c in np.flatnonzero(row > 0))}\t{line}"
            for row, line in zip(logits, lines)]  # logit > 0 <=> sigmoid > 0.5
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
