"""Trains an encoder: jaxencoder-train --config configs/NAME.py --workdir DIR [--config.key=value ...]

(the same: `python train.py ...` or `python -m jaxencoder.train ...`). The workdir may
be local or gs://bucket/path; rerunning with the same workdir resumes from its latest
checkpoint. SIGTERM / Ctrl-C save the latest finished step and exit with code 75
(EX_TEMPFAIL), which job schedulers can requeue on.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import pathlib
import sys

from jaxencoder import cli


def load_config(path: str):
  """Runs `get_config()` of a config file."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise cli.UserError(f"--config {path}: no such file")
  if path.suffix != ".py":
    raise cli.UserError(f"--config {path}: expected a Python config file (configs/*.py) with "
                    "get_config()")
  spec = importlib.util.spec_from_file_location(f"config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  if not hasattr(module, "get_config"):
    raise cli.UserError(f"--config {path}: defines no get_config()")
  return module.get_config()


def quiet_library_logs() -> None:
  """Library chatter a user cannot act on (orbax's and tfds' info and warnings through
  absl); real errors still show. JAXENCODER_VERBOSE=1 keeps everything."""
  if os.environ.get("JAXENCODER_VERBOSE"):
    return
  logging.getLogger("absl").setLevel(logging.ERROR)


def parse_args(argv):
  parser = argparse.ArgumentParser(prog="jaxencoder-train", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", help="a configs/*.py file (optional with --eval_only)")
  parser.add_argument("--workdir", required=True, help="checkpoints, metrics, TensorBoard")
  parser.add_argument("--eval_only", action="store_true",
                      help="evaluate the run's newest checkpoint and exit (no training)")
  group = parser.add_argument_group(
      "multi-process", "one process per host (or GPU); auto-detected on Cloud TPU and SLURM")
  group.add_argument("--coordinator_address", help="host:port of process 0")
  group.add_argument("--num_processes", type=int)
  group.add_argument("--process_id", type=int)
  return parse_with_overrides(parser, argv)


def parse_with_overrides(parser: argparse.ArgumentParser, argv):
  """(args, ['key=value', ...]): the parser's flags and the `--config.key=value` overrides;
  anything else is a usage error."""
  args, rest = parser.parse_known_args(argv)
  overrides = []
  for item in rest:
    if not item.startswith("--config."):
      parser.error(f"unrecognised argument {item!r} (overrides look like --config.key=value)")
    overrides.append(item[len("--config."):])
  return args, overrides


def main(argv=None) -> None:
  logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s",
                      force=True)  # absl, imported on the way, has set up a handler
  logging.getLogger("jaxencoder").setLevel(logging.INFO)
  quiet_library_logs()
  args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
  from jaxencoder.data.readers import DataError
  from jaxencoder.io.checkpoint import CheckpointError
  from jaxencoder.train.stop import EXIT_PREEMPTED, Preempted
  try:
    metrics = cli.run_main(lambda: run(args, overrides), (DataError, CheckpointError))
  except Preempted as e:
    print(e, file=sys.stderr)
    sys.exit(EXIT_PREEMPTED)
  if metrics is not None:
    print("final eval:", " ".join(f"{k}={v:.4f}" for k, v in metrics.items()))


def run(args, overrides: list[str]) -> dict[str, float] | None:
  """Loads the config, applies the overrides and trains; final eval metrics on process 0."""
  from jaxencoder.train import distributed
  distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
  from jaxencoder.train.config import apply_overrides
  import jax
  from jaxencoder.train import loop
  if args.config is None and not args.eval_only:
    raise cli.UserError("--config is required (except with --eval_only)")
  config = load_config(args.config) if args.config else None
  if config is not None:
    apply_overrides(config, overrides)
  elif overrides:
    raise cli.UserError("--config.* overrides need --config")
  if args.eval_only:
    metrics = loop.evaluate_run(config, args.workdir)
  else:
    metrics = loop.train_and_evaluate(config, args.workdir)
  return metrics if jax.process_index() == 0 else None


if __name__ == "__main__":
  main()
