"""Exports an encoder to run without jaxencoder: serialized StableHLO or ONNX.

  jaxencoder-export --run RUN_DIR --format stablehlo --out DIR
  jaxencoder-export --pretrained HF_DIR --format onnx --out DIR
  (the same: python -m jaxencoder.export ...)

Inputs are int32 [B, L], B and L symbolic (L at most the position table's rows when
positions are learned): input_ids, attention_mask (1 = real token), and token_type_ids
when the model has type embeddings. Outputs: a classifier run's head (tasks classify,
multilabel, regression: `logits` [B, C]; token_classify: [B, L, C]); otherwise the
encoder's `last_hidden_state` [B, L, D] and `pooled` [B, D] (the model's pooling).
DIR gets model.stablehlo (`jax.export.deserialize` reads it; lowered for --platforms) or
model.onnx (+ model.onnx.data, its weights; converted by jax2onnx, run by onnxruntime),
export.json (inputs, outputs, symbolic dims, model config, source, the check below) and
the tokenizer file. Unless --no-check, the export is reloaded and run on a padded batch,
and its largest difference from JAX's outputs is printed and kept in export.json.
ONNX needs `pip install 'jaxencoder[export]'` and `pip install --no-deps jax2onnx==0.17.1`
(its metadata pins orbax-checkpoint < 0.11.37, which pip would satisfy by downgrading).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import time

from jaxencoder import cli, export
from jaxencoder.export import CHECK_SHAPE, FILES, PLATFORMS, SPEC, Servable
from jaxencoder.io import outputs

TOOL = "jaxencoder-export"  # named in the marker of what it writes (io.outputs)

# The model modules are imported where they are used: --help answers at once.


def read_model(run: str | None, pretrained: str | None) -> tuple[Servable, str | None]:
  """(Servable, tokenizer file or None) of a run directory or a Hugging Face directory."""
  if pretrained:
    from jaxencoder import pretrained as hf
    from jaxencoder.pretrained.hf_checkpoint import encoder_params
    if not pathlib.Path(pretrained, "config.json").exists():
      raise FileNotFoundError(f"--pretrained {pretrained}: no config.json there (a Hugging "
                              "Face encoder directory)")
    cfg, params, _ = hf.load(pretrained)
    return (export.servable(cfg, encoder_params(params), source={"pretrained": pretrained}),
            tokenizer_file(pretrained))
  from jaxencoder.io.run_dir import RunDir
  from jaxencoder.restore_targets import stored_config, stored_encoder
  from jaxencoder.tokenizer import run_tokenizer
  run_dir = RunDir.open(run)  # the newest step that restores (a damaged one: a warning)
  step, encoder = run_dir.newest_restorable(lambda s: stored_encoder(run_dir, step=s))
  config, cfg = run_dir.read_config(step), stored_config(run_dir, step)
  source = {"run": run, "step": step, "task": config.get("task")}
  if classifier_task(config, cfg):
    from jaxencoder.train import predict
    p = predict.load(run, step)  # with its head (the encoder is read again)
    return (export.servable(p.cfg, p.params, head=p.model, source=source, labels=p.label_names),
            tokenizer_file(run_tokenizer(run_dir)))
  # As jaxencoder-convert: a converted directory without tokenizer files gets none.
  has_tokenizer = run_dir.tokenizer_path() or "data" in config
  tokenizer = tokenizer_file(run_tokenizer(run_dir)) if has_tokenizer else None
  return export.servable(cfg, encoder, source=source), tokenizer


def tokenizer_file(path) -> str | None:
  """The tokenizer file at `path` (the file, or the one a directory holds, as the
  Tokenizer reads it); None if there is none."""
  from jaxencoder.tokenizer import resolve_file
  try:
    return str(resolve_file(path))
  except FileNotFoundError:
    return None


def classifier_task(config: dict, cfg) -> bool:
  """Whether a run trained an EncoderClassifier (its head's logits are exported)."""
  if "task" not in config or cfg.input_kind != "text":
    return False
  from jaxencoder.heads import EncoderClassifier
  from jaxencoder.tasks import registry
  task = registry.task_from_config(config, cfg, num_classes=config.get("num_classes", 2))
  return isinstance(task.model, EncoderClassifier)


def _inputs(args: argparse.Namespace) -> list[outputs.Labelled]:
  """What the export reads: the --pretrained directory, or the --run and its tokenizer."""
  if args.pretrained:
    return [("--pretrained", args.pretrained)]
  from jaxencoder.io.run_dir import RunDir
  return outputs.run_inputs("--run", RunDir.open(args.run))


def write(args: argparse.Namespace) -> str:
  """Writes DIR; returns a one-line summary."""
  fmt = args.format
  if fmt not in FILES:
    raise cli.UserError(cli.unknown("format", fmt, FILES, f"formats: {', '.join(FILES)}"))
  if bool(args.run) == bool(args.pretrained):
    raise cli.UserError("give one of --run RUN_DIR or --pretrained HF_DIR")
  out = pathlib.Path(args.out)
  outputs.check_apart(("--out", out), _inputs(args))
  outputs.check_replaceable("--out", out, TOOL, args.overwrite)
  s, tokenizer = read_model(args.run, args.pretrained)
  out.mkdir(parents=True, exist_ok=True)
  for stale in out.glob("model.*"):  # --overwrite: no weights of another export stay
    stale.unlink()
  start = time.perf_counter()
  if fmt == "onnx":
    export.export_onnx(s, out / FILES[fmt])
  else:
    export.export_stablehlo(s, out / FILES[fmt], tuple(args.platforms.split(",")))
  seconds = time.perf_counter() - start
  extra = {"export_seconds": round(seconds, 2), "tokenizer": None}
  if fmt == "stablehlo":
    extra["platforms"] = args.platforms.split(",")
  if tokenizer:
    shutil.copy(tokenizer, out / pathlib.Path(tokenizer).name)
    extra["tokenizer"] = pathlib.Path(tokenizer).name
  note = ""
  if not args.no_check:
    diffs = export.check(s, fmt, out / FILES[fmt])
    extra["check"] = {"shape": list(CHECK_SHAPE), "max_abs_diff": diffs}
    note = f"; max |diff| vs JAX on a padded {CHECK_SHAPE} batch: {max(diffs.values()):.1e}"
  (out / SPEC).write_text(json.dumps(export.describe(s, fmt, **extra), indent=2) + "\n")
  outputs.mark(out, TOOL)
  size = sum(f.stat().st_size for f in out.glob("model.*")) / 2**20
  return (f"wrote {out / FILES[fmt]} ({size:.1f} MiB, {seconds:.1f} s; inputs "
          f"{', '.join(s.inputs)} [B, L] int32 -> {', '.join(s.outputs)}){note}")


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="jaxencoder-export", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--run", help="a train.py workdir or converted checkpoint (latest step)")
  p.add_argument("--pretrained", help="a Hugging Face encoder directory")
  p.add_argument("--format", default="stablehlo", help=f"{' or '.join(FILES)} (default stablehlo)")
  p.add_argument("--out", required=True, help="output directory")
  p.add_argument("--platforms", default=",".join(PLATFORMS),
                 help="stablehlo: platforms to lower for (default: %(default)s)")
  p.add_argument("--no-check", action="store_true",
                 help="skip running the export against JAX on a padded batch")
  p.add_argument("--overwrite", action="store_true",
                 help="write into an --out that this command wrote earlier")
  cli.add_verbose_flag(p)
  return p.parse_args(argv)


def main(argv=None) -> None:
  args = parse_args(argv)
  cli.run_main(lambda: print(write(args)))


if __name__ == "__main__":
  main()
