"""Trains an encoder: jaxencoder-train --config configs/NAME.py --workdir DIR [--config.key=value ...]

(the same: `python train.py ...` or `python -m jaxencoder.train ...`). The workdir may
be local or gs://bucket/path; rerunning with the same workdir resumes from its latest
checkpoint. SIGTERM / Ctrl-C save the latest finished step and exit with code 75
(EX_TEMPFAIL), which job schedulers can requeue on; so does a disk that fills up during
a save, with one line naming the step that failed and the last durable one. A loss that
becomes NaN/Inf exits 1 naming the step, the last durable one and what to lower; so does
a step out of device memory, naming the batch and about the largest one that fits.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from jaxencoder import cli

# Library names that lived here until issue 43 (a CLI module holds argument parsing only).
__getattr__ = cli.moved_names(__name__, {
    "load_config": "jaxencoder.train.config_file.load_config",
    "parse_with_overrides": "jaxencoder.cli.parse_with_overrides",
    "full_disk": "jaxencoder.train.stop.full_disk",
    "check_before_writing": "jaxencoder.train.preflight.check_before_writing",
    "check_writable_workdir": "jaxencoder.train.preflight.check_writable_workdir"})


def build_parser() -> argparse.ArgumentParser:
  """jaxencoder-train's flags (the CLI reference renders its help)."""
  parser = argparse.ArgumentParser(prog="jaxencoder-train", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", help="a configs/*.py file (optional with --eval_only)")
  parser.add_argument("--workdir", help="checkpoints, metrics, TensorBoard (required)")
  parser.add_argument("--eval_only", action="store_true",
                      help="evaluate the run's newest checkpoint and exit (no training)")
  parser.add_argument("--print_config", action="store_true",
                      help="print the config with the overrides applied (every key) and exit")
  cli.add_verbose_flag(parser)
  group = parser.add_argument_group(
      "multi-process", "one process per host (or GPU); auto-detected on Cloud TPU and SLURM")
  group.add_argument("--coordinator_address", help="host:port of process 0")
  group.add_argument("--num_processes", type=int)
  group.add_argument("--process_id", type=int)
  return parser


def parse_args(argv):
  parser = build_parser()
  args, overrides = cli.parse_with_overrides(parser, argv)
  if args.workdir is None and not args.print_config:
    parser.error("the following arguments are required: --workdir")
  return args, overrides


def main(argv=None) -> None:
  logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s",
                      force=True)  # absl, imported on the way, has set up a handler
  logging.getLogger("jaxencoder").setLevel(logging.INFO)
  args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
  cli.quiet_library_logs()  # before the imports below: they load orbax and tfds
  # lazy: --help stays fast
  from jaxencoder.data.readers import DataError
  from jaxencoder.io.checkpoint import CheckpointError
  from jaxencoder.train.loop import NonFiniteLossError
  from jaxencoder.train.out_of_memory import OutOfMemory
  from jaxencoder.train import stop
  from jaxencoder.train.stop import EXIT_PREEMPTED, Preempted, full_disk
  stop.exit_on_second_interrupt = True  # no KeyboardInterrupt from inside XLA (stop.py)
  try:
    metrics = cli.run_main(lambda: run(args, overrides), (DataError, CheckpointError))
  except Preempted as e:
    print(e, file=sys.stderr)
    sys.exit(EXIT_PREEMPTED)
  except (NonFiniteLossError, OutOfMemory) as e:  # not resumable as is: the config must change
    if os.environ.get("JAXENCODER_TRACEBACK"):
      raise
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  except OSError as e:
    full = full_disk(e)
    if full is None or os.environ.get("JAXENCODER_TRACEBACK"):
      raise
    print(full, file=sys.stderr)  # resumable: rerun once there is space
    sys.stderr.flush()
    os._exit(EXIT_PREEMPTED)  # the failed save's leftover writes would print at exit
  if metrics is not None:
    print("final eval:", " ".join(f"{k}={v:.4f}" for k, v in metrics.items()))


def run(args, overrides: list[str]) -> dict[str, float] | None:
  """Loads the config, applies the overrides and trains; final eval metrics on process 0."""
  if args.print_config:
    return print_config(args.config, overrides)
  from jaxencoder.train import distributed  # lazy: --help stays fast
  distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
  # lazy: --help stays fast
  from jaxencoder.train.config import apply_overrides
  import jax
  from jaxencoder.io import paths
  from jaxencoder.train import finished, loop
  from jaxencoder.train.config_file import load_config
  from jaxencoder.train.preflight import check_before_writing, check_writable_workdir
  if args.config is None and not args.eval_only:
    raise cli.UserError("--config is required (except with --eval_only)")
  config = load_config(args.config) if args.config else None
  if config is not None:
    apply_overrides(config, overrides)
  elif overrides:
    raise cli.UserError("--config.* overrides need --config")
  if args.eval_only:
    if config is not None:
      check_before_writing(config, train=False)
    metrics = loop.evaluate_run(config, args.workdir)
  else:
    check_before_writing(config)
    # a run refused or failed before its first checkpoint leaves no workdir behind
    leader = jax.process_index() == 0
    with paths.removed_if_left_empty(args.workdir, enabled=leader), \
        finished.removed_if_unfinished(args.workdir, enabled=leader):
      check_writable_workdir(args.workdir)
      metrics = loop.train_and_evaluate(config, args.workdir)
  return metrics if jax.process_index() == 0 else None


def print_config(path: str | None, overrides: list[str]) -> None:
  """Prints every key of the config at `path` (the base config without one), overridden."""
  # lazy: --help stays fast
  from jaxencoder.train.config import apply_overrides, base_config
  from jaxencoder.train.config_file import load_config
  config = load_config(path) if path else base_config()
  apply_overrides(config, overrides)
  print(config)


if __name__ == "__main__":
  main()
