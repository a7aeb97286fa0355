"""Probe what each layer of a checkpoint represents; writes OUT/report.json and PNG plots.

  jaxencoder-probe --pretrained HF_DIR --data tagged.txt --out probe_out
  jaxencoder-probe --checkpoint WORKDIR --data sentences.csv --out probe_out
  jaxencoder-probe --pretrained VIT_DIR --data images.npz --out probe_out   # images
  (the same: python -m jaxencoder.probing ...)

OUT is a new or empty directory; `--overwrite` replaces one this command wrote (all of
it: no plot of the earlier study stays), never a folder it did not write.
`--checkpoint` is a run directory: a train.py workdir (its config, newest encoder params
that restore, past a damaged step, and metrics.jsonl for the training-health report) or
a converted checkpoint;
`--pretrained` a Hugging Face directory (BERT, RoBERTa, DistilBERT, ELECTRA, ModernBERT,
ViT: see jaxencoder.pretrained). Paths may be gs:// URLs. Text data: `word/TAG` lines or
`.conllu` (word-level probe), `.csv`/`.tsv` `text,label` rows (sentence-level probe), or
a directory of such files (its *.txt and *.conllu, or its *.csv and *.tsv, as one set).
Image data (image encoders): a prepared image_arrays dataset directory (`python -m
jaxencoder.data`; `--split`) or a `.npz` with `images` [N, H, W(, C)] on the 0..255
scale and `labels` [N] (+ `label_names`); one [CLS] (or `--pool mean` patch-mean)
vector per image and layer, normalised as train.py does for --checkpoint runs, as the
directory's preprocessor_config.json (else ViTImageProcessor's defaults) for
--pretrained. Images of another size are refused: `--image-size H,W` loads the model
with its position grid resampled; `--max-len N` extends a text position table.
Features stream to per-layer .npy files in a scratch folder under OUT, deleted at the end;
`--keep-features` keeps them in OUT/features (`probing.features.load_features` reads them).
Layers: 0 = the embeddings, i = transformer block i; heads count from 0 (plots and report).
"""

from __future__ import annotations

import argparse
import sys

from jaxencoder import cli

# Library names that lived here until issue 43 (a CLI module holds argument parsing only).
__getattr__ = cli.moved_names(__name__, {
    **{name: f"jaxencoder.probing.load.{name}"
       for name in ("load_checkpoint", "load_pretrained", "read_data")},
    **{name: f"jaxencoder.probing.command.{name}" for name in ("probe", "options_from", "TOOL")},
    **{name: f"jaxencoder.probing.study.{name}" for name in ("headline", "summary")}})


def build_parser() -> argparse.ArgumentParser:
  """jaxencoder-probe's flags (the CLI reference renders its help)."""
  p = argparse.ArgumentParser(prog="jaxencoder-probe", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  source = p.add_mutually_exclusive_group(required=True)
  source.add_argument("--checkpoint", help="a train.py workdir (or its checkpoints/ dir)")
  source.add_argument("--pretrained", help="a Hugging Face encoder directory")
  p.add_argument("--data", required=True,
                 help="word/TAG .txt, .conllu, or .csv/.tsv file, or a directory of them; "
                 "images: dataset dir or .npz")
  p.add_argument("--out", required=True, help="output directory (new or empty; see --overwrite)")
  p.add_argument("--overwrite", action="store_true", help="replace an --out that this command "
                 "wrote earlier (all of it: no plot of the earlier study stays)")
  p.add_argument("--tokenizer", help="override the tokenizer (vocab.txt / tokenizer.json)")
  p.add_argument("--pool", help="word: first|mean; sentence, image: cls|mean")
  p.add_argument("--max-sentences", type=int, help="use at most this many sentences / images")
  p.add_argument("--split", default="train", help="image dataset directory: the split")
  p.add_argument("--max-len", type=int, help="text: extend the learned position table to N "
                 "rows (interpolated, untrained; warns)")
  p.add_argument("--image-size", type=cli.parse_image_size, help="images: H,W; load the model with "
                 "its position grid resampled to this size (interpolated, untrained; warns)")
  p.add_argument("--label-column", default="label", help="CSV/TSV: the label column's name")
  p.add_argument("--text-column", help="CSV/TSV: the text column's name (default: text)")
  p.add_argument("--no-header", action="store_true",
                 help="CSV/TSV without a header row: text,label per line")
  p.add_argument("--max-length", type=int,
                 help="tokens per sentence (default: 128, or --max-len when given)")
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--keep-features", action="store_true", help="keep the per-layer features "
                 "in OUT/features (.npy; default: streamed to a scratch folder, deleted)")
  p.add_argument("--stream", action="store_true", help=argparse.SUPPRESS)  # the default now
  p.add_argument("--mlp", action="store_true", help="also an MLP probe per layer")
  p.add_argument("--no-control", action="store_true", help="skip the control task")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--l2", type=float, default=1e-4)
  p.add_argument("--max-epochs", type=int, default=40)
  p.add_argument("--sentence", help="sentence for the attention heat maps (default: first)")
  study = p.add_argument_group("studies beyond one checkpoint's accuracy")
  study.add_argument("--steps", help="with --checkpoint: probe these kept steps of the run "
                     "('all', or e.g. 1000,2000), one compiled extractor for all")
  study.add_argument("--mdl", action="store_true", help="also minimum description length "
                     "probes (online code, Voita & Titov 2020), per layer")
  study.add_argument("--heads", action="store_true", help="head importance by masking each "
                     "head alone, the gradient estimate, and the pruning curve")
  study.add_argument("--heads-sentences", type=int, default=256,
                     help="sentences the head study runs on (default 256)")
  study.add_argument("--amnesic", action="store_true", help="amnesic probing: erase the "
                     "property (LEACE) at each layer, rerun the rest of the model and report "
                     "its own objective (MLM loss and accuracy, or a classifier's loss) before "
                     "and after, a random-direction control, and the probe after erasure; "
                     "needs an MLM or classifier head")
  study.add_argument("--amnesic-sentences", type=int, default=256,
                     help="--amnesic: test-split sentences the objective is scored on")
  study.add_argument("--patch", metavar="PAIRS", help="activation patching on minimal pairs "
                     "(JSON lines: clean, corrupted, target_clean, target_corrupted; `python "
                     "-m jaxencoder.data fetch agreement_pairs` writes some): the recovered "
                     "logit difference per layer x position and layer x head; needs an MLM head")
  study.add_argument("--similarity", action="store_true", help="CKA between every layer pair "
                     "of the model and, with --against / --against-checkpoint, another one")
  study.add_argument("--against", help="--similarity: a second Hugging Face encoder dir")
  study.add_argument("--against-checkpoint", help="--similarity: a second train.py run dir")
  study.add_argument("--unbiased", action="store_true",
                     help="--similarity: the unbiased HSIC estimator (Song et al. 2012)")
  p.add_argument("--collapse", default="{}", help='JSON, e.g. {"max_mean_cosine": 0.95}')
  p.add_argument("--health", default="{}", help='JSON, e.g. {"max_gap": 0.2}')
  return p


def parse_args(argv=None) -> argparse.Namespace:
  return build_parser().parse_args(argv)


def check_study_flags(args: argparse.Namespace) -> None:
  """Flags that only make sense together, named in one line."""
  if args.steps and not args.checkpoint:
    raise ValueError("--steps probes the kept steps of a train.py run: pass --checkpoint RUN")
  if (args.against or args.against_checkpoint) and not args.similarity:
    raise ValueError("--against / --against-checkpoint compare two models: add --similarity")
  if args.against and args.against_checkpoint:
    raise ValueError("--similarity compares against one model: pass --against or "
                     "--against-checkpoint, not both")
  if (args.amnesic or args.patch) and (args.similarity or args.steps):
    raise ValueError("--amnesic / --patch study one checkpoint: run them without "
                     "--similarity and --steps")
  if args.similarity and args.steps:
    raise ValueError("--similarity and --steps are separate studies: run them one at a time")


def main(argv=None) -> dict:
  """The study's report (what report.json holds); flags as `jaxencoder-probe --help`."""
  args = parse_args(argv)
  if args.stream:
    print("note: --stream is the default now (features streamed, then deleted); "
          "--keep-features keeps them in OUT/features", file=sys.stderr)

  def run():
    check_study_flags(args)
    from jaxencoder.probing import command  # lazy: --help stays fast (and a bad flag)
    return command.probe(args)
  return cli.run_main(run)


def script(argv=None) -> None:
  """The `jaxencoder-probe` command: exit status 0 (a console script exits with what its
  function returns, and the report is not an exit status)."""
  main(argv)


if __name__ == "__main__":
  main()
