"""Checkpoints converted both ways (`jaxencoder-convert`): a Hugging Face directory into a
jaxencoder run directory, a run into a Hugging Face directory of its family (LoRA adapters
merged; with `sentence`, a sentence-transformers directory too), a merged run, or the
adapters alone; and a run's params as an export reads them
(`restore_for_export`), or its encoder and tokenizer as the probe and jaxencoder.load read
them (`read_run`).
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile

from jaxencoder.model import lora
from jaxencoder.model.electra import Electra
from jaxencoder.model.encoder import ENCODER
from jaxencoder.io import outputs, paths
from jaxencoder.io.run_dir import RunDir
from jaxencoder.pretrained import hf_checkpoint, sentences
from jaxencoder.pretrained.adapters_file import ADAPTERS_FILE, write_adapters
from jaxencoder.pretrained.electra_names import DISCRIMINATOR_HEAD
from jaxencoder.pretrained.resolver import is_hf_dir, resolve
from jaxencoder.model.restore_targets import (abstract_params, encoder_params, restore_encoder,
                                        stored_config, stored_encoder, write_encoder)
from jaxencoder.tokenizer import Tokenizer, check_fits, run_tokenizer

TOOL = "jaxencoder-convert"  # named in the marker of what it writes (io.outputs)

FAMILY_NAMES = {"bert": "BERT", "roberta": "RoBERTa", "distilbert": "DistilBERT",
                "electra": "ELECTRA", "modernbert": "ModernBERT", "vit": "ViT"}


def _inputs(source) -> list[outputs.Labelled]:
  """What converting `source` reads: a Hugging Face directory, or a run and its tokenizer."""
  return [("--from", source)] if is_hf_dir(source) else outputs.run_inputs(
      "--from", RunDir.open(source))


def convert(source, target, *, scan_layers: bool = False, overwrite: bool = False,
            max_len: int | None = None, image_size: tuple[int, int] | None = None,
            merge_lora: bool = False, adapters_only: bool = False,
            sentence: sentences.SentenceConfig | None = None) -> str:
  """Converts in the direction SRC's contents imply; returns a one-line summary. SRC may
  be a registered name ("minilm") or RUN@STEP (resolver.resolve). `sentence`: a text
  run's Hugging Face directory becomes a sentence-transformers directory that computes
  it (`sentences.write_sentence_transformers`; export/sentence_dir.py decides it from the
  run's task).

  TARGET must lie apart from SOURCE (and its tokenizer); a non-empty TARGET is replaced
  only with `overwrite` and only if this command wrote it (io.outputs). The result is
  written to a temporary directory and moved (uploaded, for gs://) into place, so TARGET
  never mixes old and new files (e.g. a stale 1_Pooling/) and a failed conversion leaves
  it untouched.
  """
  target, where = paths.as_path(target), resolve(source)
  source = where.path
  if where.step is not None and adapters_only:
    raise ValueError("--adapters_only writes the run's newest adapters; drop @STEP")
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
  if sentence is not None and (lora_out or is_hf_dir(source)):
    raise ValueError(f"--{lora_out} writes jaxencoder files; a sentence-transformers directory is "
                     f"a Hugging Face one: drop --{lora_out}" if lora_out else
                     "a sentence-transformers directory is written from a jaxencoder run; SRC "
                     "is a Hugging Face directory")
  outputs.check_apart(("--to", target), _inputs(source))
  outputs.check_replaceable("--to", target, TOOL, overwrite)
  local_parent = None if paths.is_url(target) else pathlib.Path(target).parent
  if local_parent is not None:
    local_parent.mkdir(parents=True, exist_ok=True)
  staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=local_parent))
  try:
    with paths.local_copy(source) if is_hf_dir(source) else contextlib.nullcontext(source) as src:
      summary = _convert_into(src, staging, scan_layers, resize, lora_out, where.step, sentence)
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
                  lora_out: str | None = None, step: int | None = None,
                  sentence: sentences.SentenceConfig | None = None) -> str:
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
  cfg, params = restore_for_export(run, step)
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
  if sentence is None:
    return f"wrote Hugging Face {family} directory {target}{note}"
  if tokenizer is None:
    why = ("it has no tokenizer files" if cfg.input_kind == "text"
           else f"an {cfg.input_kind} encoder")
    raise ValueError(f"{source}: {why}; a sentence-transformers directory embeds text with the "
                     "run's tokenizer")
  sentences.write_sentence_transformers(target, cfg, params, sentence)
  return (f"wrote sentence-transformers directory {target} ({family}; "
          f"{sentences.describe(sentence, cfg)})")


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


def read_run(workdir, tokenizer_path: str | None = None, *, step: int | None = None,
             **resize):
  """(cfg, params, tokenizer) of a run directory's `step`, by default its newest checkpoint
  that restores (a train.py workdir or a converted checkpoint; local or gs://); tokenizer
  None for image encoders. `resize`: max_len / image_size, as `pretrained.load`."""
  run = RunDir.open(workdir)
  step, stored_params = run.newest_restorable(lambda s: stored_encoder(run, step=s), step)
  cfg, params = hf_checkpoint.resize_on_load(stored_config(run, step), stored_params, **resize)
  if cfg.input_kind == "image":
    return cfg, params, None
  vocab = run_tokenizer(run, tokenizer_path, fix="pass --tokenizer")
  tokenizer = Tokenizer.from_file(vocab)
  check_fits(tokenizer, cfg, f"tokenizer {vocab}")
  return cfg, params, tokenizer
