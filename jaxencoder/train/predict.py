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
import logging
import pathlib

import flax.linen as nn
import ml_collections
import numpy as np

from jaxencoder import cli
from jaxencoder.config import EncoderConfig
from jaxencoder.io.checkpoint import _first_line, restore_params_only
from jaxencoder.io.run_dir import RunDir
from jaxencoder.restore_targets import abstract_params
from jaxencoder.tasks import registry
from jaxencoder.tasks.base import Family
from jaxencoder.tokenizer import Tokenizer, check_fits, run_tokenizer
from jaxencoder.train import datasets

BATCH = 32
log = logging.getLogger("jaxencoder")


class UnsupportedRun(ValueError):
  """A run predict cannot serve (not a damaged checkpoint: no older step helps)."""


@dataclasses.dataclass
class Predictor:
  """A restored run: its task name and family, model config, task params, tokenizer and
  labels."""
  task: str
  family: Family
  cfg: EncoderConfig
  model: nn.Module
  params: dict
  tokenizer: Tokenizer
  seq_len: int
  label_names: list[str] | None

  def label(self, index: int) -> str:
    """A class's name from the run's dataset, else its index."""
    return self.label_names[index] if self.label_names else str(index)

  @property
  def predicts(self) -> str:
    """"lines", "words" (pre-tokenized lines) or "vectors" (the family's `predicts`)."""
    return self.family.predicts[self.task]


def load(run_path, step: int | None = None) -> Predictor:
  """The run's model at `step`; by default at its newest step that restores (a damaged
  newer one is skipped with a warning, as training skips it on resume). Reads only."""
  run = RunDir.open(run_path)
  p, config = _restore(run, run_path, step)
  cfg = p.cfg
  vocab = run_tokenizer(run, fix="put the run's tokenizer files in it")
  tokenizer = Tokenizer.from_file(vocab)
  check_fits(tokenizer, cfg, f"tokenizer {vocab}")
  seq_len = min(config["data"]["seq_len"], cfg.max_positions)
  return dataclasses.replace(p, tokenizer=tokenizer, seq_len=seq_len)


def _restore(run: RunDir, run_path, step: int | None) -> tuple[Predictor, dict]:
  """(Predictor without its tokenizer, config) of `step`, or of the newest step that
  restores; else a ValueError naming each step tried and why."""
  saved = ", ".join(map(str, run.steps()))
  if step is not None and step not in run.steps():
    raise FileNotFoundError(f"{run.checkpoint_dir}: no step {step}; saved steps: {saved}")
  failures = []
  for candidate in [step] if step is not None else run.steps()[::-1]:
    try:
      return _restore_step(run, run_path, candidate)
    except UnsupportedRun:
      raise
    except Exception as e:  # orbax / tensorstore raise many types for damaged files
      failures.append(f"step {candidate}: {_first_line(e)}")
      if step is None:
        log.warning("checkpoint step %d in %s cannot be restored (%s); trying an older step",
                    candidate, run.checkpoint_dir, _first_line(e))
  fix = (f"pass another --step (saved: {saved}), or none for the newest that restores"
         if step is not None else "restore the checkpoints from a copy, or retrain")
  raise ValueError(f"no restorable checkpoint in {run.checkpoint_dir}: "
                   f"{'; '.join(failures)}; {fix}")


def _restore_step(run: RunDir, run_path, step: int) -> tuple[Predictor, dict]:
  config = run.read_config(step)
  cfg = EncoderConfig.from_dict(config["model"])
  if cfg.input_kind != "text":
    raise UnsupportedRun(f"{run_path}: predict reads text; this run's input_kind is "
                         f"{cfg.input_kind!r}")
  names = _label_names(config)
  task_name, family = registry.owner(config)
  if task_name not in family.predicts:
    supported = [n for f in registry.FAMILIES for n in f.predicts]
    raise UnsupportedRun(f"{run_path}: predict does not support task {task_name!r} "
                         f"(supported: {', '.join(supported)})")
  task = registry.task_from_config(config, cfg, num_classes=len(names) if names
                                   else config.get("num_classes", 2))
  example = family.init_inputs(task_name)
  params = restore_params_only(run.checkpoint_dir, abstract_params(cfg, task.model, example),
                               subtree=("params",), step=step)
  return Predictor(task_name, family, cfg, task.model, params, None, 0, names), config


def _label_names(config: dict) -> list[str] | None:
  """Class names from the run's prepared dataset, if it can still be opened."""
  data = ml_collections.ConfigDict(config["data"])
  try:
    return datasets.label_names(data, data.source)
  except Exception:  # the dataset moved or was deleted: fall back to indices
    return None


def predict(p: Predictor, lines: list[str]) -> list[str] | np.ndarray:
  """Output lines, or pooled vectors [N, D] (the task's family's `predicts`)."""
  outputs = []
  for start in range(0, len(lines), BATCH):
    outputs.append(_predict_batch(p, lines[start:start + BATCH]))
  if p.predicts != "vectors":
    return [line for batch in outputs for line in batch]
  return np.concatenate(outputs) if outputs else np.zeros((0, p.cfg.emb_dim), np.float32)


def _predict_batch(p: Predictor, lines: list[str]):
  if p.predicts == "words":
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
  return p.family.predict(p.task, p, batch, args, lines)


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
