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
in the run's metrics.jsonl). Labels are named as the run stored them when it began
(run_record.json), not from the dataset as it is now; a run made before runs stored them
takes them from its prepared dataset when it is still there, else prints class indices.

  --scores      classify: each class's probability (softmax); multilabel: each label's
                sigmoid; a column per class, named by the run's labels. Other tasks have
                no per-class scores (their prediction is the whole output): an error.
  --format jsonl (or --out FILE.jsonl): one JSON object per input line,
                {"input", "prediction" (a vector for embeddings), "scores": {class: p}}.
  --batch-size  lines per forward pass; any size gives the same predictions.

Row i of every output is line i of --input. A blank line (empty or only whitespace) is
not run through the model: in text output it gives an empty line (with --scores: an empty
prediction and nan scores), in jsonl {"input": LINE, "blank": true} (no prediction or
scores), in a .npy of vectors a row of NaN (not zeros, which look like a vector).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import pathlib
from typing import TYPE_CHECKING

import numpy as np

from jaxencoder import cli
from jaxencoder import progress as progress_lib
from jaxencoder.model.config import EncoderConfig
from jaxencoder.errors import NotDamaged

if TYPE_CHECKING:  # the model side loads on use: `--help` imports no JAX or Flax
  import flax.linen as nn

  from jaxencoder.io.run_dir import RunDir
  from jaxencoder.tasks.base import Family
  from jaxencoder.tokenizer import Tokenizer

BATCH = 32  # lines per forward pass (--batch-size)
log = logging.getLogger("jaxencoder")


class UnsupportedRun(NotDamaged):
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
  """The run's model at `step` (or RUN@STEP's); by default at its newest step that restores
  (a damaged newer one is skipped with a warning, as training skips it on resume). Reads
  only."""
  # lazy: --help stays fast
  from jaxencoder.io.run_dir import RunDir
  from jaxencoder.tokenizer import Tokenizer, check_fits, run_tokenizer
  run_path, step = _run_and_step(run_path, step)
  run = RunDir.open(run_path)
  p, config = _restore(run, run_path, step)
  cfg = p.cfg
  vocab = run_tokenizer(run, fix="put the run's tokenizer files in it")
  tokenizer = Tokenizer.from_file(vocab)
  check_fits(tokenizer, cfg, f"tokenizer {vocab}")
  seq_len = min(config["data"]["seq_len"], cfg.max_positions)
  return dataclasses.replace(p, tokenizer=tokenizer, seq_len=seq_len)


def _run_and_step(run_path, step: int | None) -> tuple[str, int | None]:
  """(run directory, step) of RUN or RUN@STEP (resolver.resolve); a Hugging Face directory
  or name is UnsupportedRun: it has no task to predict."""
  from jaxencoder.pretrained.resolver import resolve  # lazy: --help stays fast
  where = resolve(run_path)
  if where.kind == "hf":
    raise UnsupportedRun(f"{run_path}: a Hugging Face encoder, not a run trained with a task; "
                         f"predict needs a task run (jaxencoder.load({str(run_path)!r}) "
                         "embeds and encodes it)")
  if None not in (step, where.step) and step != where.step:
    raise ValueError(f"{run_path}: names step {where.step}, and step={step} was asked for")
  return where.path, where.step if step is None else step


def _restore(run: RunDir, run_path, step: int | None) -> tuple[Predictor, dict]:
  """(Predictor without its tokenizer, config) of `step`, or of the newest step that
  restores (RunDir.newest_restorable); a `step` that does not restore is one error naming
  --step."""
  from jaxencoder.io.run_dir import UnrestorableStep  # lazy: --help stays fast
  if step is not None and step not in (saved := run.steps()):
    raise FileNotFoundError(f"{run.checkpoint_dir}: no step {step}; saved steps: "
                            f"{', '.join(map(str, saved))}")
  try:
    return run.newest_restorable(lambda s: _restore_step(run, run_path, s), step)[1]
  except UnrestorableStep as e:
    if step is None:
      raise
    raise UnrestorableStep(
        f"no restorable checkpoint in {run.checkpoint_dir}: step {step}: {e.reason}; pass "
        f"another --step (saved: {', '.join(map(str, saved))}), or none for the newest that "
        "restores", e.reason) from None


def _restore_step(run: RunDir, run_path, step: int) -> tuple[Predictor, dict]:
  # lazy: --help stays fast
  from jaxencoder.io.checkpoint import restore_params_only
  from jaxencoder.model.restore_targets import abstract_params
  from jaxencoder.tasks import registry
  config = run.read_config(step)
  cfg = EncoderConfig.from_dict(config["model"])
  if cfg.input_kind != "text":
    raise UnsupportedRun(f"{run_path}: predict reads text; this run's input_kind is "
                         f"{cfg.input_kind!r}")
  names, stored = _label_names(run, config)
  task_name, family = registry.owner(config)
  if task_name not in family.predicts:
    supported = [n for f in registry.TASK_FAMILIES for n in f.predicts]
    raise UnsupportedRun(f"{run_path}: predict does not support task {task_name!r} "
                         f"(supported: {', '.join(supported)})")
  task = registry.task_from_config(config, cfg, num_classes=len(names) if names
                                   else config.get("num_classes", 2))
  example = family.init_inputs(task_name)
  abstract = abstract_params(cfg, task.model, example)
  if names and not stored:
    _check_head_size(run, abstract, names, step)
  params = restore_params_only(run.checkpoint_dir, abstract, subtree=("params",), step=step)
  return Predictor(task_name, family, cfg, task.model, params, None, 0, names), config


def _label_names(run: RunDir, config: dict) -> tuple[list[str] | None, bool]:
  """(class names, whether the run stored them): those in its run_record.json; for a run
  made before runs recorded them, those of its prepared dataset as it is now (with a
  warning), if it can still be opened."""
  # lazy: --help stays fast
  import ml_collections
  from jaxencoder.io import run_record
  from jaxencoder.train import datasets
  record = run_record.read(run.path)
  if record is not None and "labels" in record:
    return record["labels"], True
  data = ml_collections.ConfigDict(config["data"])
  try:
    names = datasets.label_names(data, data.source)
  except Exception:  # the dataset moved or was deleted: fall back to indices
    return None, False
  if names:
    log.warning("%s stores no label names (made by an older jaxencoder): naming classes "
                "from %s as it is now", run.path, data.source)
  return names, False


def _check_head_size(run: RunDir, abstract: dict, names: list[str], step: int) -> None:
  """UnsupportedRun when the head's stored outputs are not as many as today's classes (the
  dataset gained or lost one since training): not a damaged checkpoint."""
  # lazy: --help stays fast
  import jax
  theirs = run.param_shapes(step)
  for path, x in jax.tree_util.tree_leaves_with_path(abstract):
    key = jax.tree_util.keystr(path, simple=True, separator="/")
    if key in theirs and theirs[key] != x.shape and len(names) in x.shape:
      raise UnsupportedRun(
          f"{run.path}: its dataset changed since training: it now has {len(names)} classes, "
          f"the run's head {key} has shape {theirs[key]}, not {x.shape}; the checkpoints are "
          "intact: predict with the dataset as it was, or train on the new one")


@dataclasses.dataclass
class Predictions:
  """Outputs of N lines, and their class scores when asked for: row i is line i. A blank
  line (empty or whitespace-only) is not run through the model: its output line is "", its
  vector and scores NaN (zeros would read as a prediction), and blank_N marks it."""
  outputs: list[str] | np.ndarray  # output lines, or pooled vectors [N, D]
  scores_NxC: np.ndarray | None = None
  score_names: list[str] | None = None  # the class of each score column
  blank_N: np.ndarray | None = None  # [N] bool: the blank lines


def predict(p: Predictor, lines: list[str], *, batch_size: int = BATCH,
            progress: bool = False) -> list[str] | np.ndarray:
  """Output lines, or pooled vectors [N, D] (the task's family's `predicts`)."""
  return predictions(p, lines, batch_size=batch_size, progress=progress).outputs


def predictions(p: Predictor, lines: list[str], *, batch_size: int = BATCH,
                scores: bool = False, progress: bool = False) -> Predictions:
  """Predictions of `lines`, a row per line (a blank one gets "" or NaN, see Predictions),
  `batch_size` at a time (any size gives the same results); `scores`: also one score per
  class (a ValueError for a task without them). `progress`: a bar (or plain lines) over
  the batches, on stderr."""
  if batch_size < 1:
    raise ValueError(f"batch size {batch_size}: needs at least 1 line per batch")
  if scores and p.task not in p.family.scored:
    raise ValueError(_no_scores(p.task))
  blank_N = np.array([not line.strip() for line in lines], bool)
  kept = [line for line, blank in zip(lines, blank_N) if not blank]
  return _with_blank_rows(_predict_batches(p, kept, batch_size, scores, progress), blank_N)


def _predict_batches(p: Predictor, lines: list[str], batch_size: int, scores: bool,
                     progress: bool) -> Predictions:
  outputs, scored = [], []
  starts = range(0, len(lines), batch_size)
  for start in progress_lib.track(starts, "predicting", unit="batch", enabled=progress):
    chunk = lines[start:start + batch_size]
    batch, args = _encode(p, chunk)
    outputs.append(p.family.predict(p.task, p, batch, args, chunk))
    if scores:
      scored.append(p.family.scores(p.task, p, args))
  if p.predicts == "vectors":
    result = Predictions(np.concatenate(outputs) if outputs
                         else np.zeros((0, p.cfg.emb_dim), np.float32))
  else:
    result = Predictions([line for batch in outputs for line in batch])
  if scores:
    result.scores_NxC = np.concatenate(scored) if scored else np.zeros((0, 0))
    result.score_names = [p.label(c) for c in range(result.scores_NxC.shape[1])]
  return result


def _with_blank_rows(result: Predictions, blank_N: np.ndarray) -> Predictions:
  """`result` of the non-blank lines, spread to every line: "" or NaN at the blank ones."""
  if isinstance(result.outputs, np.ndarray):
    outputs = _nan_rows(result.outputs, blank_N)
  else:
    outputs = iter(result.outputs)
    outputs = ["" if blank else next(outputs) for blank in blank_N]
  scores_NxC = None if result.scores_NxC is None else _nan_rows(result.scores_NxC, blank_N)
  return Predictions(outputs, scores_NxC, result.score_names, blank_N)


def _nan_rows(values_KxC: np.ndarray, blank_N: np.ndarray) -> np.ndarray:
  """[N, C]: `values_KxC` at the K non-blank rows, NaN at the blank ones."""
  dtype = np.result_type(values_KxC.dtype, np.float32)
  full_NxC = np.full((len(blank_N), values_KxC.shape[1]), np.nan, dtype)
  full_NxC[~blank_N] = values_KxC
  return full_NxC


def _no_scores(task: str) -> str:
  from jaxencoder.tasks import registry  # lazy: --help stays fast
  scored = [name for family in registry.TASK_FAMILIES for name in family.scored]
  return (f"--scores: a {task!r} run has no per-class scores (its prediction is the whole "
          f"output); scores come with {', '.join(scored)} runs")


def _encode(p: Predictor, lines: list[str]) -> tuple[dict, tuple]:
  """(tokenizer batch, model args) of a few input lines."""
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
  return batch, (batch["input_ids"], batch["attention_mask"], types)


def build_parser() -> argparse.ArgumentParser:
  """jaxencoder-predict's flags (the CLI reference renders its help)."""
  parser = argparse.ArgumentParser(prog="jaxencoder-predict", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--run", required=True, help="a train.py workdir (local or gs://)")
  parser.add_argument("--input", required=True, help="a text file, one input per line (a "
                      "blank line keeps its row: empty, NaN, or flagged \"blank\" in jsonl)")
  parser.add_argument("--out", help="output file (default: stdout; .npy for embeddings; "
                      ".jsonl: JSON lines)")
  parser.add_argument("--step", type=int, help="checkpoint step (default: the latest)")
  parser.add_argument("--scores", action="store_true",
                      help="also each class's probability (classify, multilabel runs)")
  parser.add_argument("--format", choices=("text", "jsonl"),
                      help="text lines (embeddings: .npy) or JSON lines (default: jsonl when "
                      "--out ends in .jsonl, else text)")
  parser.add_argument("--batch-size", type=_positive, default=BATCH,
                      help=f"lines per forward pass (default: {BATCH})")
  return parser


def main(argv=None) -> None:
  args = build_parser().parse_args(argv)
  logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
  cli.run_main(lambda: _main(args))


def _positive(text: str) -> int:
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"{text}: needs a whole number >= 1")
  return value


def _main(args) -> None:
  if args.out:  # before any work: a refused --out costs nothing
    _check_out(args.out, args)
  lines = read_lines(args.input)
  jsonl = (args.format or ("jsonl" if (args.out or "").endswith(".jsonl") else "text")) == "jsonl"
  p = load(args.run, args.step)
  cli.log_backend()  # after the run's own errors (one line each), before the predictions
  result = predictions(p, lines, batch_size=args.batch_size, scores=args.scores, progress=True)
  blanks = int(result.blank_N.sum())
  note = lambda kept_as: f" ({blanks} blank lines: {kept_as})" if blanks else ""
  if jsonl:
    rows = [json.dumps(record) for record in json_records(result, lines)]
    _emit(args.out, rows, f"{len(lines)} predictions, JSON lines{note('flagged blank')}")
  elif isinstance(result.outputs, np.ndarray):
    out = pathlib.Path(args.out or "embeddings.npy")
    if not args.out:  # the default name, checked now that it is known (--out was at the start)
      _check_out(out, args)
    np.save(out, result.outputs)
    print(f"wrote {out}: {result.outputs.shape[0]} x {result.outputs.shape[1]} pooled vectors"
          f"{note('rows of NaN')}")
  else:
    _emit(args.out, text_lines(result, lines),
          f"{len(lines)} predictions{note('empty predictions')}")


def read_lines(path) -> list[str]:
  """The lines of a UTF-8 text file, split at line ends only (LF, CRLF, CR): row i of the
  output is line i, as an editor numbers them (str.splitlines also splits at form feeds
  and U+2028)."""
  with open(path, encoding="utf-8") as f:  # universal newlines: every line end reads "\n"
    text = f.read()
  return text.removesuffix("\n").split("\n") if text else []


def _check_out(out, args) -> None:
  """Refuses an output file that is the --input file or lies in the run (or its tokenizer)."""
  # lazy: --help stays fast
  from jaxencoder.io import outputs as outputs_lib
  from jaxencoder.io.run_dir import RunDir
  run = RunDir.open(_run_and_step(args.run, None)[0])
  inputs = [("--input", args.input), *outputs_lib.run_inputs("--run", run)]
  outputs_lib.check_apart(("--out", out), inputs)


def _emit(out: str | None, rows: list[str], what: str) -> None:
  """Rows to the file `out`, else to stdout."""
  if out:
    pathlib.Path(out).write_text("".join(row + "\n" for row in rows), encoding="utf-8")
    print(f"wrote {out}: {what}")
  elif rows:
    print("\n".join(rows))


def prediction_of(output: str, line: str) -> str:
  """The prediction alone: an output line ("prediction<TAB>input" or tagged words) without
  its input."""
  return output.removesuffix("\t" + line)


def json_records(result: Predictions, lines: list[str]) -> list[dict]:
  """{"input", "prediction"[, "scores": {class: score}]} per input line; a blank line's is
  {"input", "blank": true}."""
  records = []
  for i, (output, line) in enumerate(zip(result.outputs, lines)):
    if result.blank_N is not None and result.blank_N[i]:
      records.append({"input": line, "blank": True})
      continue
    record = {"input": line, "prediction": output.tolist() if isinstance(output, np.ndarray)
              else prediction_of(output, line)}
    if result.scores_NxC is not None:
      record["scores"] = dict(zip(result.score_names, map(float, result.scores_NxC[i])))
    records.append(record)
  return records


def text_lines(result: Predictions, lines: list[str]) -> list[str]:
  """The output lines; with scores, "prediction<TAB>score per class<TAB>input" under a
  header naming the columns."""
  if result.scores_NxC is None:
    return list(result.outputs)
  header = "\t".join(["prediction", *result.score_names, "input"])
  return [header] + ["\t".join([prediction_of(output, line), *(f"{v:.6f}" for v in row), line])
                     for output, row, line in zip(result.outputs, result.scores_NxC, lines)]


if __name__ == "__main__":
  main()
