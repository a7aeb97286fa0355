"""Converts checkpoints: jaxencoder-convert --from SRC --to DST (or python -m jaxencoder.pretrained convert).

SRC a Hugging Face directory (config.json + model.safetensors; model_type bert,
roberta, distilbert or electra, or another family in hf_checkpoint.FAMILY_MODULES): DST
becomes a jaxencoder run directory that `train.py --config.init_from=DST` and
`jaxencoder-probe --checkpoint DST` read (architecture and family included).
SRC a jaxencoder run directory (written by this command, or a train.py workdir, or
its checkpoints/ folder; local or gs://): DST becomes a Hugging Face directory of the
run's family (model.family; "bert" unless the run began from another family). For an
embedding run (task contrastive), or any text run with `--sentence-transformers`, it is a
sentence-transformers directory too: `SentenceTransformer(DST).encode` gives the run's
`jaxencoder.load(RUN).embed` (its pooling, data.seq_len, normalisation when its loss
normalises): modules.json, sentence_bert_config.json, 1_Pooling and
config_sentence_transformers.json (docs/export.md, "Sentence-transformers").
A run trained with LoRA (model.lora_rank > 0) has its adapters merged into its kernels
(W + alpha / r A B) on the way out; `--merge_lora` writes that as a plain jaxencoder run
directory instead, `--adapters_only` writes only the adapters to DST/adapters.safetensors
(a few MB; `read_adapters` reads it back).
HF -> jaxencoder only, opt-in: `--max_len N` extends a learned text position table to N
rows, `--image_size H,W` resamples a ViT's position grid (interpolated, untrained
positions: a warning is logged; see hf_checkpoint.resize_on_load).
"""

from __future__ import annotations

import argparse

from jaxencoder import cli
from jaxencoder.pretrained.named_checkpoints import NAMED_CHECKPOINTS, named_checkpoint

# Library names that lived here until issue 43 (a CLI module holds argument parsing only).
__getattr__ = cli.moved_names(__name__, {
    **{name: f"jaxencoder.pretrained.convert.{name}"
       for name in ("convert", "is_hf_dir", "restore_for_export", "FAMILY_NAMES", "TOOL")},
    **{name: f"jaxencoder.pretrained.adapters_file.{name}"
       for name in ("ADAPTERS_FILE", "write_adapters", "read_adapters")},
    "image_size": "jaxencoder.cli.parse_image_size"})


def build_parser() -> argparse.ArgumentParser:
  """jaxencoder-convert's flags (the CLI reference renders its help)."""
  parser = argparse.ArgumentParser(prog="jaxencoder-convert", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--from", dest="source", help="SRC (required)")
  parser.add_argument("--to", dest="target", help="DST (required)")
  parser.add_argument("--where", metavar="NAME",
                      help=f"print the directory of a named checkpoint "
                           f"({', '.join(NAMED_CHECKPOINTS)}) and exit")
  parser.add_argument("--scan_layers", action="store_true",
                      help="HF -> jaxencoder: store the scanned layout (init_from converts "
                           "either layout on load)")
  parser.add_argument("--max_len", type=int,
                      help="HF -> jaxencoder: extend the learned text position table to N rows")
  parser.add_argument("--image_size", type=cli.parse_image_size,
                      help="HF -> jaxencoder: H,W (or S): resample a ViT's position grid")
  parser.add_argument("--merge_lora", action="store_true",
                      help="a LoRA run -> a jaxencoder run directory, adapters merged into "
                           "the kernels")
  parser.add_argument("--adapters_only", action="store_true",
                      help="a LoRA run -> DST/adapters.safetensors, its adapters only")
  parser.add_argument("--sentence-transformers", dest="sentence_transformers",
                      action="store_true",
                      help="run -> a sentence-transformers directory for any text run (an "
                           "embedding run, e.g. task contrastive, gets one without it)")
  parser.add_argument("command", nargs="?", choices=["convert"],
                      help="optional, for `python -m jaxencoder.pretrained convert ...`")
  parser.add_argument("--overwrite", action="store_true",
                      help="replace a --to directory that this command wrote earlier (all of it)")
  cli.add_verbose_flag(parser)
  return parser


def main(argv=None) -> None:
  parser = build_parser()
  args = parser.parse_args(argv)
  if args.where:
    print(cli.run_main(lambda: named_checkpoint(args.where)))
    return
  if args.source is None or args.target is None:
    parser.error("the following arguments are required: --from, --to (or --where NAME)")

  def run() -> str:
    # lazy: --help stays fast (and --where; run_main quiets the libraries first)
    from jaxencoder.export.sentence_dir import convert
    return convert(args.source, args.target, scan_layers=args.scan_layers,
                   overwrite=args.overwrite, max_len=args.max_len, image_size=args.image_size,
                   merge_lora=args.merge_lora, adapters_only=args.adapters_only,
                   sentence_transformers=args.sentence_transformers)
  print(cli.run_main(run))


if __name__ == "__main__":
  main()
