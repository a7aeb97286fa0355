"""Probe what each layer of a checkpoint represents; writes OUT/report.json and PNG plots.

  jaxencoder-probe --pretrained HF_DIR --data tagged.txt --out probe_out
  jaxencoder-probe --checkpoint WORKDIR --data sentences.csv --out probe_out
  (the same: python -m jaxencoder.probing ...)

`--checkpoint` is a run directory: a train.py workdir (its config, latest encoder
params and metrics.jsonl for the training-health report) or a converted checkpoint;
`--pretrained` a Hugging Face BERT directory. Paths may be gs:// URLs. Data: `word/TAG` lines or `.conllu` (word-level probe), `.csv`/`.tsv`
`text,label` rows (sentence-level probe).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile

import numpy as np

from jaxencoder import cli
from jaxencoder.data import readers
from jaxencoder.io import paths
from jaxencoder.io.run_dir import RunDir
from jaxencoder.probing import features, probes, representation, study
from jaxencoder.probing.health import HealthThresholds
from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path


def load_checkpoint(workdir, tokenizer_path: str | None = None):
  """(cfg, params, tokenizer) of a run directory's latest checkpoint (a train.py workdir
  or a converted checkpoint; local or gs://)."""
  run = RunDir.open(workdir)
  cfg = run.model_config()
  params = run.restore_encoder()
  vocab = tokenizer_path or run.tokenizer_path() or default_tokenizer_path()
  if not vocab:
    raise FileNotFoundError("no tokenizer: pass --tokenizer (vocab.txt / tokenizer.json)")
  return cfg, params, Tokenizer.from_file(vocab)


def load_pretrained(hf_dir, tokenizer_path: str | None = None):
  """(cfg, params, tokenizer) of a Hugging Face BERT dir (via jaxencoder.pretrained)."""
  from jaxencoder import pretrained  # imported lazily: an optional, separate module
  cfg, params, tokenizer = pretrained.load(hf_dir)
  params = params["encoder"] if "encoder" in params else params
  if tokenizer_path or tokenizer is None:
    tokenizer = Tokenizer.from_file(tokenizer_path or hf_dir)
  return cfg, params, tokenizer


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="jaxencoder-probe", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  source = p.add_mutually_exclusive_group(required=True)
  source.add_argument("--checkpoint", help="a train.py workdir (or its checkpoints/ dir)")
  source.add_argument("--pretrained", help="a Hugging Face BERT directory")
  p.add_argument("--data", required=True, help="word/TAG, .conllu, or .csv/.tsv file")
  p.add_argument("--out", required=True, help="output directory")
  p.add_argument("--tokenizer", help="override the tokenizer (vocab.txt / tokenizer.json)")
  p.add_argument("--pool", help="word: first|mean; sentence: cls|mean")
  p.add_argument("--max-sentences", type=int)
  p.add_argument("--label-column", default="label", help="CSV/TSV: the label column's name")
  p.add_argument("--text-column", help="CSV/TSV: the text column's name (default: text)")
  p.add_argument("--no-header", action="store_true",
                 help="CSV/TSV without a header row: text,label per line")
  p.add_argument("--max-length", type=int, default=128)
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--stream", action="store_true", help="features as per-layer .npy memmaps")
  p.add_argument("--mlp", action="store_true", help="also an MLP probe per layer")
  p.add_argument("--no-control", action="store_true", help="skip the control task")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--l2", type=float, default=1e-4)
  p.add_argument("--max-epochs", type=int, default=40)
  p.add_argument("--sentence", help="sentence for the attention heat maps (default: first)")
  p.add_argument("--collapse", default="{}", help='JSON, e.g. {"max_mean_cosine": 0.95}')
  p.add_argument("--health", default="{}", help='JSON, e.g. {"max_gap": 0.2}')
  return p.parse_args(argv)


def options_from(args: argparse.Namespace) -> study.StudyOptions:
  return study.StudyOptions(
      pool=args.pool, batch_size=args.batch_size, max_length=args.max_length,
      stream=args.stream, mlp=args.mlp, control=not args.no_control,
      probe=probes.ProbeConfig(seed=args.seed, l2=args.l2, max_epochs=args.max_epochs),
      collapse=representation.CollapseThresholds.from_dict(json.loads(args.collapse)),
      health_thresholds=HealthThresholds.from_dict(json.loads(args.health)),
      attention_sentence=args.sentence)


def main(argv=None) -> dict:
  args = parse_args(argv)
  return cli.run_main(lambda: probe(args))


def probe(args: argparse.Namespace) -> dict:
  """Loads the model and data, runs the study, prints the summary table. Any path may be
  a gs:// URL: inputs are read through local copies, outputs uploaded at the end."""
  with contextlib.ExitStack() as stack:
    local = lambda p: p and str(stack.enter_context(paths.local_copy(p)))
    if args.checkpoint:  # a run directory is read in place (orbax reads gs:// itself)
      cfg, params, tokenizer = load_checkpoint(args.checkpoint, local(args.tokenizer))
    else:
      cfg, params, tokenizer = load_pretrained(local(args.pretrained), local(args.tokenizer))
    columns = readers.Columns(text=args.text_column, label=args.label_column,
                              header=not args.no_header)
    dataset = features.read_dataset(local(args.data), max_sentences=args.max_sentences,
                                    columns=columns)
    out = paths.as_path(args.out)
    out_local = stack.enter_context(tempfile.TemporaryDirectory()) if paths.is_url(out) else out
    rep = study.run(cfg, params, tokenizer, dataset, out_local, options_from(args),
                    workdir=args.checkpoint, source=args.checkpoint or args.pretrained)
    if paths.is_url(out):
      paths.copy_tree(out_local, out)
  print(summary(rep))
  print(f"wrote {out / 'report.json'} and {len(rep['plots'])} plots")
  return rep


def summary(rep: dict) -> str:
  """A plain-text table: per layer, probe accuracy / selectivity and health."""
  lines = ["layer  " + "  ".join(f"{k}_acc  {k}_sel" for k in rep["probes"])
           + "  mean_cos  erank_c  collapsed"]
  for n, health_n in enumerate(rep["representation"]):
    cells = []
    for result in rep["probes"].values():
      row = result["layers"][n]
      cells.append(f"{row['accuracy']:.3f}  {row.get('selectivity', float('nan')):+.3f}")
    lines.append(f"{n:5d}  " + "  ".join(cells) + f"  {health_n['anisotropy']:8.3f}"
                 f"  {health_n['effective_rank_centered']:7.1f}  {health_n['collapsed']}")
  if rep.get("attention"):
    entropy_NxH = np.asarray(rep["attention"]["entropy"])
    lines.append("attention entropy (nats), layer x head:")
    lines += [f"{n + 1:5d}  " + " ".join(f"{v:.2f}" for v in row)
              for n, row in enumerate(entropy_NxH)]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
