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
model.onnx (converted by jax2onnx, run by onnxruntime; its weights inside, or in
model.onnx.data beside it past protobuf's 2 GB: export.json's external_data), export.json
(inputs, outputs, symbolic dims, a classifier's id2label, model config, source, the check
below) and tokenizer.json (padding a batch to its longest text, truncating at the model's
length), each readable by all (0644). Unless --no-check, the export is reloaded and run on
a padded batch, and its largest difference from JAX's outputs is printed and kept in
export.json.
ONNX needs `pip install 'jaxencoder[export]'` and `pip install --no-deps jax2onnx==0.17.1`
(its metadata pins orbax-checkpoint < 0.11.37, which pip would satisfy by downgrading).
"""

from __future__ import annotations

import argparse

from jaxencoder import cli
from jaxencoder.export import FILES, PLATFORMS

# Library names that lived here until issue 43 (a CLI module holds argument parsing only).
__getattr__ = cli.moved_names(__name__, {
    name: f"jaxencoder.export.writer.{name}"
    for name in ("read_model", "tokenizer_file", "classifier_task", "write", "TOOL")})


def build_parser() -> argparse.ArgumentParser:
  """jaxencoder-export's flags (the CLI reference renders its help)."""
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
  return p


def parse_args(argv=None) -> argparse.Namespace:
  return build_parser().parse_args(argv)


def main(argv=None) -> None:
  args = parse_args(argv)

  def write() -> str:
    # lazy: --help stays fast (and run_main quiets the libraries first)
    from jaxencoder.export import writer
    return writer.write(args.out, args.format, run=args.run, pretrained=args.pretrained,
                        platforms=args.platforms.split(","), check=not args.no_check,
                        overwrite=args.overwrite)
  cli.run_main(lambda: print(write()))


if __name__ == "__main__":
  main()
