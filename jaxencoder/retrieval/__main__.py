"""jaxencoder-eval: retrieval and STS metrics of a model, as train.py reports them at each
eval (eval_retrieval, eval_sts).

  jaxencoder-eval --model minilm --retrieval DIR [--sts FILE] [--json]

DIR: a retrieval set in BEIR's format (corpus.jsonl, queries.jsonl, qrels.tsv):
ndcg@10, mrr@10 and recall@100 over its whole corpus (exact search). FILE: scored pairs, a
CSV / TSV with the header columns text, text_b, score: spearman. The model embeds as
jaxencoder.load(MODEL).embed does (its pooling, length and normalisation).
"""

from __future__ import annotations

import argparse

from jaxencoder import cli


def build_parser() -> argparse.ArgumentParser:
  """jaxencoder-eval's flags (the CLI reference renders their help)."""
  parser = argparse.ArgumentParser(prog="jaxencoder-eval", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model", required=True, help="a registered name (minilm), a Hugging "
                      "Face / sentence-transformers dir, a run dir or RUN@STEP")
  parser.add_argument("--retrieval", default="", metavar="DIR",
                      help="a BEIR-format retrieval set: ndcg@10, mrr@10, recall@100")
  parser.add_argument("--sts", default="", metavar="FILE",
                      help="scored pairs (CSV / TSV: text, text_b, score): spearman")
  parser.add_argument("--batch-size", type=int, default=32, help="texts embedded at once")
  parser.add_argument("--block", type=int, default=4096,
                      help="corpus rows searched at once (memory: queries x block scores)")
  parser.add_argument("--json", action="store_true", help="one JSON object of the metrics")
  cli.add_verbose_flag(parser)
  return parser


def _run(args) -> None:
  # lazy: --help stays fast (JAX, the model)
  import jaxencoder
  from jaxencoder.retrieval.evaluate import Evaluators, report
  if not (args.retrieval or args.sts):
    raise cli.UserError("nothing to evaluate: give --retrieval DIR and/or --sts FILE")
  evaluators = Evaluators.read(args.retrieval, args.sts, block=args.block)  # before the model
  cli.log_backend()
  model = jaxencoder.load(args.model)
  values = evaluators(lambda texts: model.embed(texts, batch_size=args.batch_size))
  print(report(values, as_json=args.json))


def main(argv=None):
  args = build_parser().parse_args(argv)
  cli.run_main(lambda: _run(args))


if __name__ == "__main__":
  main()
