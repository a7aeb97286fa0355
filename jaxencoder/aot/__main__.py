"""Compiles a config's train and eval steps for a TPU slice (or NVIDIA GPUs) ahead of time,
on any host, and reports whether they fit:

  jaxencoder-compile --config configs/mlm_bert_base.py --topology v5e-8 [--max_batch] \\
      [--json] [--slices N] [--config.key=value ...]

(the same: `python -m jaxencoder.aot ...`). The steps are those train.py would run for the
config (task, optimizer, mesh from mesh_shape over the target's devices, logical rules,
dtype, remat, scan, attention), compiled for abstract batches of the config's shapes:
no data is read. Reports per chip: memory against the chip's HBM, matmul FLOPs, the
collectives in the compiled program, the attention kernels it holds, compile seconds.
Exit code 0: compiled and fits; 1: does not fit or does not compile; 2: a bad flag, config
or topology. Speed cannot be read from a deviceless compile; only what fits and what runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from jaxencoder import cli
from jaxencoder.aot.targets import UnknownTopologyError, parse_target

EXIT_DOES_NOT_FIT = 1

# A name that lived here until issue 43 (a CLI module holds argument parsing only).
__getattr__ = cli.moved_names(__name__, {"format_table": "jaxencoder.aot.compile_report.format_report"})


def build_parser() -> argparse.ArgumentParser:
  """jaxencoder-compile's flags (the CLI reference renders its help)."""
  parser = argparse.ArgumentParser(prog="jaxencoder-compile", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="a configs/*.py file")
  parser.add_argument("--topology", required=True,
                      help="v5e-8, v5litepod-8, v4-8, v5p-32, v6e-4, a chip grid (v5e:2x4), "
                           "h100 / h200-8")
  parser.add_argument("--slices", type=int, default=1,
                      help="copies of the slice over the data-center network (multi-slice)")
  parser.add_argument("--max_batch", action="store_true",
                      help="also search the largest global train batch that fits")
  parser.add_argument("--group", type=int, default=None,
                      help="texts per example of grouped text_records tasks (contrastive: 2, "
                           "or 2 + k with k hard negatives; multiple_choice: the choices; default 2 / 4)")
  parser.add_argument("--steps", default="train,eval", help="which steps: train, eval or both")
  parser.add_argument("--json", action="store_true", help="print the report as JSON")
  cli.add_verbose_flag(parser)
  return parser


def parse_args(argv):
  parser = build_parser()
  args, overrides = cli.parse_with_overrides(parser, argv)
  steps = [s.strip() for s in args.steps.split(",") if s.strip()]
  if not steps or set(steps) - {"train", "eval"}:
    parser.error(f"--steps {args.steps!r}: use train, eval or train,eval")
  args.steps = steps
  return args, overrides


def main(argv=None) -> None:
  logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s",
                      force=True)
  logging.getLogger("jaxencoder").setLevel(logging.INFO)
  args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
  result = cli.run_main(lambda: run(args, overrides), (UnknownTopologyError,))
  from jaxencoder.aot.compile_report import format_report  # lazy: --help stays fast
  print(json.dumps(result, indent=1) if args.json else format_report(result))
  if not result["fits"]:
    print(result["verdict"], file=sys.stderr)
    sys.exit(EXIT_DOES_NOT_FIT)


def run(args, overrides) -> dict:
  """Loads the config, compiles for the target, returns the report (a JSON-able dict)."""
  # lazy: --help stays fast
  from jaxencoder.aot.compile_report import compile_config
  from jaxencoder.train.config import apply_overrides
  from jaxencoder.train.config_file import load_config
  from jaxencoder.train.init_from import finalized
  target = parse_target(args.topology, args.slices)  # before the config: a typo fails fast
  config = load_config(args.config)
  apply_overrides(config, overrides)
  config = finalized(config)
  cli.log_backend()  # the host that compiles (the target is the topology)
  result = compile_config(config, target, steps=args.steps, max_batch=args.max_batch,
                          group=args.group)
  result["config"] = args.config
  return result


if __name__ == "__main__":
  main()
