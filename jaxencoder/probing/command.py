"""What `jaxencoder-probe` does with its parsed flags (probing/__main__.py parses them):
checks --out against every input, loads the model(s) and the data (gs:// inputs through
local copies), runs the study (or the similarity study, or the study across kept steps),
writes OUT (uploaded at the end) and prints the summary.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json

from jaxencoder import cli, progress
from jaxencoder.data import readers
from jaxencoder.io import outputs, paths
from jaxencoder.io.run_dir import RunDir
from jaxencoder.pretrained import resolver
from jaxencoder.probing import (causal, compare, dynamics, images, objectives, probes,
                                representation, study)
from jaxencoder.probing.health import HealthThresholds
from jaxencoder.probing.load import class_names, load_checkpoint, load_pretrained, read_data

TOOL = "jaxencoder-probe"  # named in the marker of what it writes (io.outputs)


def options_from(args: argparse.Namespace, hf_dir=None) -> study.StudyOptions:
  """StudyOptions of the flags; `hf_dir` (a local --pretrained copy) sets image normalisation."""
  return study.StudyOptions(
      pool=args.pool, batch_size=args.batch_size,
      max_length=args.max_length or args.max_len or 128,
      stream=True, keep_features=args.keep_features, mlp=args.mlp, control=not args.no_control,
      probe=probes.ProbeConfig(seed=args.seed, l2=args.l2, max_epochs=args.max_epochs),
      mdl=args.mdl, heads=args.heads, heads_sentences=args.heads_sentences,
      collapse=representation.CollapseThresholds.from_dict(json.loads(args.collapse)),
      health_thresholds=HealthThresholds.from_dict(json.loads(args.health)),
      attention_sentence=args.sentence, amnesic=args.amnesic,
      amnesic_sentences=args.amnesic_sentences, patch=args.patch,
      image_norm=images.hf_normalisation(hf_dir) if hf_dir else None)


def probe(args: argparse.Namespace) -> dict:
  """Loads the model and data, runs the study, prints the summary table. Any path may be
  a gs:// URL: inputs are read through local copies, outputs uploaded at the end."""
  outputs.check_apart(("--out", args.out), _inputs(args))
  outputs.check_replaceable("--out", args.out, TOOL, args.overwrite)  # before any work
  if args.steps:  # a step that was not kept fails now, not after the main study
    dynamics.chosen_steps(RunDir.open(args.checkpoint), args.steps)
  with contextlib.ExitStack() as stack:
    local = lambda p: p and str(stack.enter_context(paths.local_copy(p)))
    resize = {"max_len": args.max_len, "image_size": args.image_size}
    hf_dir = None
    whole = bool(args.amnesic or args.patch)  # the causal studies need the model's head
    with progress.phase(f"loading {args.checkpoint or args.pretrained}"):
      if args.checkpoint:  # a run directory is read in place (orbax reads gs:// itself)
        cfg, params, tokenizer = load_checkpoint(args.checkpoint, local(args.tokenizer),
                                                 with_head=whole, **resize)
      else:
        hf_dir = local(_pretrained_dir(args.pretrained))
        cfg, params, tokenizer = load_pretrained(hf_dir, local(args.tokenizer),
                                                 with_head=whole, **resize)
    options = options_from(args, hf_dir)
    model_params = None
    if whole:
      model_params, params, options = _causal_inputs(args, params, options, local)
    dataset = _read_data(args, local(args.data), cfg)
    cli.log_backend()  # after the model's and data's own errors, before the study
    out = paths.as_path(args.out)
    out_local = stack.enter_context(outputs.replacing("--out", out, TOOL, args.overwrite))
    source = args.checkpoint or args.pretrained
    if args.similarity:
      rep = _similarity(args, local, resize, cfg, params, tokenizer, dataset, out_local,
                        options, source)
    else:
      rep = study.run(cfg, params, tokenizer, dataset, out_local, options,
                      workdir=args.checkpoint, source=source, model_params=model_params)
      if args.steps:
        rep = dynamics.run_steps(args.checkpoint, args.steps, cfg, tokenizer, dataset,
                                 out_local, options, rep)
  if args.similarity:
    print(compare.summary(rep))
  else:
    print(study.headline(rep))
    print(study.summary(rep))
  print(f"wrote {out / 'report.json'} and {len(rep['plots'])} plots")
  return rep


def _causal_inputs(args: argparse.Namespace, params, options: study.StudyOptions, local):
  """(the whole model's params, the Encoder's, options with the patch file's local copy
  and a classifier run's class names): --amnesic / --patch, their model checked first."""
  flag = "--checkpoint" if args.checkpoint else "--pretrained"
  causal.check_model(params, amnesic_study=args.amnesic, patch=args.patch,
                     source=f"{flag} {args.checkpoint or args.pretrained}")
  names = None
  if objectives.head_of(params) == objectives.CLASSIFIER_HEAD and args.checkpoint:
    names = class_names(args.checkpoint)
  options = dataclasses.replace(options, patch=local(args.patch),
                                class_names=tuple(names) if names else None)
  return params, params[objectives.ENCODER], options


def _inputs(args: argparse.Namespace) -> list[tuple[str, str | None]]:
  """Every path the study reads (runs with their tokenizers), labelled by its flag."""
  inputs = [(flag, getattr(args, flag[2:].replace("-", "_")))
            for flag in ("--pretrained", "--data", "--tokenizer", "--against", "--patch")]
  for flag in ("--checkpoint", "--against-checkpoint"):
    run = getattr(args, flag[2:].replace("-", "_"))
    inputs += outputs.run_inputs(flag, RunDir.open(run)) if run else []
  return inputs


def _similarity(args, local, resize, cfg, params, tokenizer, dataset, out_dir, options,
                source) -> dict:
  """CKA of the model's layers with each other and, given a second model, with its."""
  other = None
  if args.against or args.against_checkpoint:
    with progress.phase(f"loading {args.against or args.against_checkpoint}"):
      if args.against_checkpoint:
        other = load_checkpoint(args.against_checkpoint, local(args.tokenizer), **resize)
      else:
        other = load_pretrained(local(_pretrained_dir(args.against)), local(args.tokenizer),
                                **resize)
  return compare.run((cfg, params, tokenizer), other, dataset, out_dir, options,
                     unbiased=args.unbiased,
                     sources=(source, args.against or args.against_checkpoint))


def _pretrained_dir(path: str) -> str:
  """--pretrained / --against: a registered name's directory ("minilm"), else `path` (a
  gs:// one is copied after)."""
  return resolver.hf_dir(path, "--pretrained", "--checkpoint reads runs")


def _read_data(args: argparse.Namespace, data, cfg):
  """--data read as the flags say (--split, --max-sentences, the CSV / TSV columns)."""
  columns = readers.Columns(text=args.text_column, label=args.label_column,
                            header=not args.no_header)
  return read_data(data, cfg, split=args.split, max_items=args.max_sentences, columns=columns)
