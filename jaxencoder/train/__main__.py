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
import importlib.util
import logging
import os
import pathlib
import sys
import tempfile
import traceback

from jaxencoder import cli


def load_config(path: str):
  """Runs `get_config()` of a config file; `FILE.py:ARG` runs `get_config(ARG)` (a variant
  the file defines, e.g. `configs/modernbert_base.py:cpu`)."""
  text, arg = str(path), ""
  if ".py:" in text:
    text, arg = text.rsplit(".py:", 1)
    text += ".py"
  path = pathlib.Path(text)
  if not path.is_file():
    raise cli.UserError(f"--config {path}: no such file")
  if path.suffix != ".py":
    raise cli.UserError(f"--config {path}: expected a Python config file (configs/*.py) with "
                    "get_config()")
  import ml_collections  # here, not at the top: --help stays light
  spec = importlib.util.spec_from_file_location(f"config_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  call = f"get_config({arg!r})" if arg else "get_config()"
  try:
    spec.loader.exec_module(module)
    if not hasattr(module, "get_config"):
      raise cli.UserError(f"--config {path}: defines no get_config()")
    config = module.get_config(arg) if arg else module.get_config()
  except cli.UserError:
    raise
  except SyntaxError as e:  # also IndentationError
    raise cli.UserError(f"--config {e.filename}:{e.lineno}: {e.msg}") from _cause(e)
  except Exception as e:  # whatever the file runs into: one line naming it, never a traceback
    raise cli.UserError(f"--config {_failing_line(path, e)}: {_one_line(e)}") from _cause(e)
  if not isinstance(config, ml_collections.ConfigDict):
    returned = "None (no return?)" if config is None else f"a {type(config).__name__}"
    raise cli.UserError(f"--config {path}: {call} returned {returned}, not an "
                        "ml_collections.ConfigDict; return one, e.g. base_config() from "
                        "jaxencoder.train.config with the keys it changes")
  return config


def _one_line(error: Exception) -> str:
  """`Type: message`, the message's first line (`Type` alone without one)."""
  lines = str(error).strip().splitlines()
  return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _cause(error: Exception) -> Exception | None:
  """The error behind a config file's one line: shown with JAXENCODER_TRACEBACK=1."""
  return error if os.environ.get("JAXENCODER_TRACEBACK") else None


def _failing_line(path: pathlib.Path, error: Exception) -> str:
  """file:line of the config file's deepest line in `error`'s traceback."""
  lines = [frame.lineno for frame in traceback.extract_tb(error.__traceback__)
           if pathlib.Path(frame.filename) == path]
  return f"{path}:{lines[-1]}" if lines else str(path)


def parse_args(argv):
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
  args, overrides = parse_with_overrides(parser, argv)
  if args.workdir is None and not args.print_config:
    parser.error("the following arguments are required: --workdir")
  return args, overrides


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
  args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
  cli.quiet_library_logs()  # before the imports below: they load orbax and tfds
  from jaxencoder.data.readers import DataError
  from jaxencoder.io.checkpoint import CheckpointError
  from jaxencoder.train.loop import NonFiniteLossError
  from jaxencoder.train.out_of_memory import OutOfMemory
  from jaxencoder.train import stop
  from jaxencoder.train.stop import EXIT_PREEMPTED, Preempted
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


def full_disk(error: OSError) -> str | None:
  """The line that names a full disk: OutOfSpace's (a checkpoint; also when closing the
  metrics writers failed after it), else the OSError's; None if the disk is not full."""
  from jaxencoder.errors import is_out_of_space
  from jaxencoder.io.checkpoint import OutOfSpace
  cause = error
  while cause is not None:
    if isinstance(cause, OutOfSpace):
      return str(cause)
    cause = cause.__cause__ or cause.__context__
  return f"out of space: {error}" if is_out_of_space(error) else None


def run(args, overrides: list[str]) -> dict[str, float] | None:
  """Loads the config, applies the overrides and trains; final eval metrics on process 0."""
  if args.print_config:
    return print_config(args.config, overrides)
  from jaxencoder.train import distributed
  distributed.initialize(args.coordinator_address, args.num_processes, args.process_id)
  from jaxencoder.train.config import apply_overrides
  import jax
  from jaxencoder.io import paths
  from jaxencoder.train import loop
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
    # a run refused before it wrote anything leaves no empty workdir behind
    with paths.removed_if_left_empty(args.workdir, enabled=jax.process_index() == 0):
      check_writable_workdir(args.workdir)
      metrics = loop.train_and_evaluate(config, args.workdir)
  return metrics if jax.process_index() == 0 else None


def check_before_writing(config, *, train: bool = True) -> None:
  """Values that cannot be right, refused before the workdir exists: the optimizer's, and
  batches that the run's devices (config.cpu_devices applied) do not divide."""
  import jax
  from jaxencoder.train import optim, sharding
  from jaxencoder.train.config import check_batches
  if train:
    optim.check(config.optim)
  sharding.use_cpu_devices(config.cpu_devices)
  check_batches(config, jax.device_count(), train=train)


def print_config(path: str | None, overrides: list[str]) -> None:
  """Prints every key of the config at `path` (the base config without one), overridden."""
  from jaxencoder.train.config import apply_overrides, base_config
  config = load_config(path) if path else base_config()
  apply_overrides(config, overrides)
  print(config)


def check_writable_workdir(workdir: str) -> None:
  """UserError naming a local --workdir that is a file or cannot be written (checked before
  anything is built or compiled); creates it if missing. gs:// paths are not checked."""
  if "://" in workdir:
    return
  path = pathlib.Path(workdir)
  if path.exists() and not path.is_dir():
    raise cli.UserError(f"--workdir {path}: is a file, not a directory; pass a directory "
                        "(a new one is created)")
  for folder in (path, path / "checkpoints"):
    if folder != path and not folder.exists():
      continue  # orbax creates it
    try:
      folder.mkdir(parents=True, exist_ok=True)
      tempfile.TemporaryFile(dir=folder).close()
    except (FileExistsError, NotADirectoryError):
      blocker = next((p for p in (folder, *folder.parents) if p.is_file()), folder)
      raise cli.UserError(f"--workdir {path}: {blocker} is a file, not a directory") from None
    except OSError as e:
      raise cli.UserError(f"--workdir {path}: {folder} is not writable ({e.strerror}); pass a "
                          "writable directory or fix its permissions") from None


if __name__ == "__main__":
  main()
