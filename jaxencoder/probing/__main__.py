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
`.conllu` (word-level probe), `.csv`/`.tsv` `text,label` rows (sentence-level probe).
Image data (image encoders): a prepared image_arrays dataset directory (`python -m
jaxencoder.data`; `--split`) or a `.npz` with `images` [N, H, W(, C)] on the 0..255
scale and `labels` [N] (+ `label_names`); one [CLS] (or `--pool mean` patch-mean)
vector per image and layer, normalised as train.py does for --checkpoint runs, as the
directory's preprocessor_config.json (else ViTImageProcessor's defaults) for
--pretrained. Images of another size are refused: `--image-size H,W` loads the model
with its position grid resampled; `--max-len N` extends a text position table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import pathlib

from jaxencoder import cli, progress

# The model, data and plotting modules are imported where they are used, so that
# `--help` and a mistyped flag answer at once (no JAX, orbax or matplotlib loaded).

TOOL = "jaxencoder-probe"  # named in the marker of what it writes (io.outputs)


def load_checkpoint(workdir, tokenizer_path: str | None = None, **resize):
  """(cfg, params, tokenizer) of a run directory's newest checkpoint that restores (a
  train.py workdir or a converted checkpoint; local or gs://); tokenizer None for image
  encoders. `resize`: max_len / image_size, as `pretrained.load`."""
  from jaxencoder.io.run_dir import RunDir
  from jaxencoder.pretrained.hf_checkpoint import resize_on_load
  from jaxencoder.restore_targets import stored_config, stored_encoder
  from jaxencoder.tokenizer import Tokenizer, check_fits, run_tokenizer
  run = RunDir.open(workdir)
  step, stored_params = run.newest_restorable(lambda s: stored_encoder(run, step=s))
  cfg, params = resize_on_load(stored_config(run, step), stored_params, **resize)
  if cfg.input_kind == "image":
    return cfg, params, None
  vocab = run_tokenizer(run, tokenizer_path, fix="pass --tokenizer")
  tokenizer = Tokenizer.from_file(vocab)
  check_fits(tokenizer, cfg, f"tokenizer {vocab}")
  return cfg, params, tokenizer


def load_pretrained(hf_dir, tokenizer_path: str | None = None, **resize):
  """(cfg, params, tokenizer) of a Hugging Face encoder dir (via jaxencoder.pretrained);
  tokenizer None for image encoders. `resize`: max_len / image_size, as `pretrained.load`."""
  from jaxencoder import pretrained  # imported lazily: an optional, separate module
  from jaxencoder.pretrained.hf_checkpoint import check_tokenizer
  from jaxencoder.tokenizer import Tokenizer
  cfg, params, tokenizer = pretrained.load(hf_dir, **resize)
  params = params["encoder"] if "encoder" in params else params
  if cfg.input_kind == "image":
    return cfg, params, None
  if tokenizer_path or tokenizer is None:
    tokenizer = Tokenizer.from_file(tokenizer_path or hf_dir)
  check_tokenizer(hf_dir, cfg, tokenizer, f"tokenizer {tokenizer_path or hf_dir}")
  return cfg, params, tokenizer


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(prog="jaxencoder-probe", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  source = p.add_mutually_exclusive_group(required=True)
  source.add_argument("--checkpoint", help="a train.py workdir (or its checkpoints/ dir)")
  source.add_argument("--pretrained", help="a Hugging Face encoder directory")
  p.add_argument("--data", required=True,
                 help="word/TAG, .conllu, or .csv/.tsv file; images: dataset dir or .npz")
  p.add_argument("--out", required=True, help="output directory (new or empty; see --overwrite)")
  p.add_argument("--overwrite", action="store_true", help="replace an --out that this command "
                 "wrote earlier (all of it: no plot of the earlier study stays)")
  p.add_argument("--tokenizer", help="override the tokenizer (vocab.txt / tokenizer.json)")
  p.add_argument("--pool", help="word: first|mean; sentence, image: cls|mean")
  p.add_argument("--max-sentences", type=int, help="use at most this many sentences / images")
  p.add_argument("--split", default="train", help="image dataset directory: the split")
  p.add_argument("--max-len", type=int, help="text: extend the learned position table to N "
                 "rows (interpolated, untrained; warns)")
  p.add_argument("--image-size", type=_image_size, help="images: H,W; load the model with "
                 "its position grid resampled to this size (interpolated, untrained; warns)")
  p.add_argument("--label-column", default="label", help="CSV/TSV: the label column's name")
  p.add_argument("--text-column", help="CSV/TSV: the text column's name (default: text)")
  p.add_argument("--no-header", action="store_true",
                 help="CSV/TSV without a header row: text,label per line")
  p.add_argument("--max-length", type=int,
                 help="tokens per sentence (default: 128, or --max-len when given)")
  p.add_argument("--batch-size", type=int, default=32)
  p.add_argument("--stream", action="store_true", help="features as per-layer .npy memmaps")
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
  study.add_argument("--similarity", action="store_true", help="CKA between every layer pair "
                     "of the model and, with --against / --against-checkpoint, another one")
  study.add_argument("--against", help="--similarity: a second Hugging Face encoder dir")
  study.add_argument("--against-checkpoint", help="--similarity: a second train.py run dir")
  study.add_argument("--unbiased", action="store_true",
                     help="--similarity: the unbiased HSIC estimator (Song et al. 2012)")
  p.add_argument("--collapse", default="{}", help='JSON, e.g. {"max_mean_cosine": 0.95}')
  p.add_argument("--health", default="{}", help='JSON, e.g. {"max_gap": 0.2}')
  return p.parse_args(argv)


def _image_size(text: str) -> tuple[int, int]:
  """--image-size's argparse type: jaxencoder-convert's, imported when the flag is given."""
  from jaxencoder.pretrained.__main__ import image_size
  return image_size(text)


def options_from(args: argparse.Namespace, hf_dir=None):
  """StudyOptions of the flags; `hf_dir` (a local --pretrained copy) sets image normalisation."""
  from jaxencoder.probing import images, probes, representation, study
  from jaxencoder.probing.health import HealthThresholds
  return study.StudyOptions(
      pool=args.pool, batch_size=args.batch_size,
      max_length=args.max_length or args.max_len or 128,
      stream=args.stream, mlp=args.mlp, control=not args.no_control,
      probe=probes.ProbeConfig(seed=args.seed, l2=args.l2, max_epochs=args.max_epochs),
      mdl=args.mdl, heads=args.heads, heads_sentences=args.heads_sentences,
      collapse=representation.CollapseThresholds.from_dict(json.loads(args.collapse)),
      health_thresholds=HealthThresholds.from_dict(json.loads(args.health)),
      attention_sentence=args.sentence,
      image_norm=images.hf_normalisation(hf_dir) if hf_dir else None)


def main(argv=None) -> dict:
  """The study's report (what report.json holds); flags as `jaxencoder-probe --help`."""
  args = parse_args(argv)

  def run():
    check_study_flags(args)
    return probe(args)
  return cli.run_main(run)


def script(argv=None) -> None:
  """The `jaxencoder-probe` command: exit status 0 (a console script exits with what its
  function returns, and the report is not an exit status)."""
  main(argv)


def probe(args: argparse.Namespace) -> dict:
  """Loads the model and data, runs the study, prints the summary table. Any path may be
  a gs:// URL: inputs are read through local copies, outputs uploaded at the end."""
  from jaxencoder.io import outputs, paths
  from jaxencoder.probing import study
  outputs.check_apart(("--out", args.out), _inputs(args))
  outputs.check_replaceable("--out", args.out, TOOL, args.overwrite)  # before any work
  if args.steps:  # a step that was not kept fails now, not after the main study
    from jaxencoder.io.run_dir import RunDir
    from jaxencoder.probing import dynamics
    dynamics.chosen_steps(RunDir.open(args.checkpoint), args.steps)
  with contextlib.ExitStack() as stack:
    local = lambda p: p and str(stack.enter_context(paths.local_copy(p)))
    resize = {"max_len": args.max_len, "image_size": args.image_size}
    hf_dir = None
    with progress.phase(f"loading {args.checkpoint or args.pretrained}"):
      if args.checkpoint:  # a run directory is read in place (orbax reads gs:// itself)
        cfg, params, tokenizer = load_checkpoint(args.checkpoint, local(args.tokenizer),
                                                 **resize)
      else:
        hf_dir = local(args.pretrained)
        cfg, params, tokenizer = load_pretrained(hf_dir, local(args.tokenizer), **resize)
    dataset = read_data(args, local(args.data), cfg)
    out = paths.as_path(args.out)
    out_local = stack.enter_context(outputs.replacing("--out", out, TOOL, args.overwrite))
    options = options_from(args, hf_dir)
    source = args.checkpoint or args.pretrained
    if args.similarity:
      rep = _similarity(args, local, resize, cfg, params, tokenizer, dataset, out_local,
                        options, source)
    else:
      rep = study.run(cfg, params, tokenizer, dataset, out_local, options,
                      workdir=args.checkpoint, source=source)
      if args.steps:
        rep = dynamics.run_steps(args.checkpoint, args.steps, cfg, tokenizer, dataset,
                                 out_local, options, rep)
  if args.similarity:
    from jaxencoder.probing import compare
    print(compare.summary(rep))
  else:
    print(headline(rep))
    print(summary(rep))
  print(f"wrote {out / 'report.json'} and {len(rep['plots'])} plots")
  return rep


def _inputs(args: argparse.Namespace) -> list[tuple[str, str | None]]:
  """Every path the study reads (runs with their tokenizers), labelled by its flag."""
  from jaxencoder.io import outputs
  from jaxencoder.io.run_dir import RunDir
  inputs = [(flag, getattr(args, flag[2:].replace("-", "_")))
            for flag in ("--pretrained", "--data", "--tokenizer", "--against")]
  for flag in ("--checkpoint", "--against-checkpoint"):
    run = getattr(args, flag[2:].replace("-", "_"))
    inputs += outputs.run_inputs(flag, RunDir.open(run)) if run else []
  return inputs


def check_study_flags(args: argparse.Namespace) -> None:
  """Flags that only make sense together, named in one line."""
  if args.steps and not args.checkpoint:
    raise ValueError("--steps probes the kept steps of a train.py run: pass --checkpoint RUN")
  if (args.against or args.against_checkpoint) and not args.similarity:
    raise ValueError("--against / --against-checkpoint compare two models: add --similarity")
  if args.against and args.against_checkpoint:
    raise ValueError("--similarity compares against one model: pass --against or "
                     "--against-checkpoint, not both")
  if args.similarity and args.steps:
    raise ValueError("--similarity and --steps are separate studies: run them one at a time")


def _similarity(args, local, resize, cfg, params, tokenizer, dataset, out_dir, options,
                source) -> dict:
  """CKA of the model's layers with each other and, given a second model, with its."""
  from jaxencoder.probing import compare
  other = None
  if args.against or args.against_checkpoint:
    with progress.phase(f"loading {args.against or args.against_checkpoint}"):
      if args.against_checkpoint:
        other = load_checkpoint(args.against_checkpoint, local(args.tokenizer), **resize)
      else:
        other = load_pretrained(local(args.against), local(args.tokenizer), **resize)
  return compare.run((cfg, params, tokenizer), other, dataset, out_dir, options,
                     unbiased=args.unbiased,
                     sources=(source, args.against or args.against_checkpoint))


def read_data(args: argparse.Namespace, data, cfg):
  """An image set (a directory or .npz) for an image encoder, else text (features.read_dataset)."""
  from jaxencoder.data import readers
  from jaxencoder.probing import features, images
  if cfg.input_kind == "image":
    if not (pathlib.Path(data).is_dir() or str(data).lower().endswith(".npz")):
      raise ValueError(f"--data {data}: an image encoder takes a prepared image_arrays "
                       "dataset directory or a .npz of images and labels")
    return images.read_dataset(data, split=args.split, max_images=args.max_sentences)
  columns = readers.Columns(text=args.text_column, label=args.label_column,
                            header=not args.no_header)
  return features.read_dataset(data, max_sentences=args.max_sentences, columns=columns)


def headline(rep: dict) -> str:
  """One line: family, input kind, pooling (and for text the tokenizer)."""
  if rep["tokenizer"] is None:
    norm = rep["input"]["normalisation"]
    return (f"{rep['model']['family']} encoder, {rep['input']['kind']} input, "
            f"{rep['input']['pool']} pooling, normalised as {norm['source']}")
  return (f"{rep['model']['family']} encoder, {rep['tokenizer']['kind']} tokenizer"
          + (f", words as their {rep['tokenizer']['word_alignment']}"
             if rep["tokenizer"]["word_alignment"] else ""))


def summary(rep: dict) -> str:
  """A plain-text table: per layer, probe accuracy / selectivity ("-": no control task, as
  for sentence labels), the majority baseline beside them, and health."""
  accuracy_probes = {k: v for k, v in rep["probes"].items() if k != "mdl"}
  mdl = rep["probes"].get("mdl")
  names = [f"{k}_{col}" for k in accuracy_probes for col in ("acc", "sel")]
  names += ["mdl_comp", "ctrl_comp"] if mdl else []
  row_of = lambda cells: "  ".join(f"{c:>{len(name)}}" for c, name in zip(cells, names))
  lines = ["layer  " + row_of(names) + "  majority  mean_cos  erank_c  collapsed"]
  majority = rep["majority_baseline"]["accuracy"]
  for n, health_n in enumerate(rep["representation"]):
    cells = []
    for result in accuracy_probes.values():
      row = result["layers"][n]
      cells += [f"{row['accuracy']:.3f}", _signed(row.get("selectivity"))]
    if mdl:
      row = mdl["layers"][n]
      cells += [f"{row['compression']:.2f}",
                f"{row['control_compression']:.2f}" if "control_compression" in row else "-"]
    lines.append(f"{n:5d}  " + row_of(cells) + f"  {majority:8.3f}  {health_n['anisotropy']:8.3f}"
                 f"  {health_n['effective_rank_centered']:7.1f}  {health_n['collapsed']}")
  lines.append(f"majority: always {rep['majority_baseline']['label']!r}, the most frequent "
               "training label, scored on the test split")
  if mdl:
    lines.append("mdl_comp: uniform / online code length of the labels (1 = no information); "
                 "ctrl_comp: the same for the control task")
  if rep.get("heads"):
    study = rep["heads"]
    top = ", ".join(f"layer {h['layer'] + 1} head {h['head']} (+{h['importance']:.3f})"
                    for h in study["most_important"][:3])
    lines.append(f"heads ({study['sentences']} sentences, probe loss {study['base_loss']:.3f}, "
                 f"accuracy {study['base_accuracy']:.3f}): most important {top}")
  if rep.get("attention"):
    lines.append("attention entropy (nats), layer x head:")
    lines += [f"{n + 1:5d}  " + " ".join(f"{v:.2f}" for v in row)
              for n, row in enumerate(rep["attention"]["entropy"])]
  return "\n".join(lines)


def _signed(value: float | None) -> str:
  """`+0.123`, or "-" where there is no value (no control task, or not finite)."""
  return f"{value:+.3f}" if value is not None and math.isfinite(value) else "-"



if __name__ == "__main__":
  main()
