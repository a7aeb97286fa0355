"""What a probing study reads: the model, from a run directory or a Hugging Face directory
(`(cfg, params, tokenizer)`), and the data it probes, text or images."""

from __future__ import annotations

import pathlib

from jaxencoder import pretrained
from jaxencoder.data import readers
from jaxencoder.io import run_record
from jaxencoder.io.run_dir import RunDir
from jaxencoder.model.heads import EncoderClassifier
from jaxencoder.model.restore_targets import abstract_params
from jaxencoder.pretrained.convert import read_run, restore_for_export
from jaxencoder.pretrained.hf_checkpoint import check_tokenizer
from jaxencoder.pretrained import resolver
from jaxencoder.probing import features, images
from jaxencoder.probing.objectives import CLASSIFIER_HEAD
from jaxencoder.tokenizer import Tokenizer


def load_checkpoint(workdir, tokenizer_path: str | None = None, *, with_head: bool = False,
                    **resize):
  """(cfg, params, tokenizer) of a run directory's newest checkpoint that restores, or of
  RUN@STEP (resolver.resolve; a Hugging Face directory or name: `load_pretrained`);
  tokenizer None for image encoders. `resize`: max_len / image_size, as `pretrained.load`.
  `with_head`: the whole model's params, {"encoder", "mlm_head"} when the run saved its
  MLM head (else the Encoder's, as without)."""
  where = resolver.resolve(workdir)
  if where.kind == "hf":
    return load_pretrained(where.path, tokenizer_path, with_head=with_head, **resize)
  cfg, params, tokenizer = read_run(where.path, tokenizer_path, step=where.step, **resize)
  if with_head and cfg.input_kind == "text":
    run = RunDir.open(where.path)
    _, whole = restore_for_export(run, where.step)
    head = {k: v for k, v in whole.items() if k != "encoder"} if "encoder" in whole else (
        _classifier_head(run, cfg, where.step))
    params = {"encoder": params, **head} if head else params  # the encoder as read_run read it
  return cfg, params, tokenizer


def _classifier_head(run: RunDir, cfg, step: int | None) -> dict | None:
  """{"head": params} of a classify / token_classify run, else None."""
  kernel = run.param_shapes(step).get(f"{CLASSIFIER_HEAD}/classifier/kernel")
  task = run.read_config(step).get("task")
  if kernel is None or task not in ("classify", "token_classify"):
    return None
  model = EncoderClassifier(cfg, kernel[-1], token_level=task == "token_classify")
  abstract = abstract_params(cfg, model)[CLASSIFIER_HEAD]
  return {CLASSIFIER_HEAD: run.restore_subtree(abstract, CLASSIFIER_HEAD, step=step)}


def class_names(workdir) -> list[str] | None:
  """A classifier run's class names, index order (its run_record.json), or None."""
  record = run_record.read(RunDir.open(resolver.resolve(workdir).path).path)
  return None if record is None else record.get("labels")


def load_pretrained(hf_dir, tokenizer_path: str | None = None, *, with_head: bool = False,
                    **resize):
  """(cfg, params, tokenizer) of a Hugging Face encoder dir or a registered name ("minilm",
  via jaxencoder.pretrained); tokenizer None for image encoders. `resize`: max_len /
  image_size, as `pretrained.load`. `with_head`: the whole model's params ({"encoder",
  "mlm_head"} for a *ForMaskedLM directory; the Encoder's without a head)."""
  hf_dir = resolver.hf_dir(hf_dir, "--pretrained", "--checkpoint reads runs")
  cfg, params, tokenizer = pretrained.load(hf_dir, **resize)
  if not with_head:
    params = params["encoder"] if "encoder" in params else params
  if cfg.input_kind == "image":
    return cfg, params, None
  if tokenizer_path or tokenizer is None:
    tokenizer = Tokenizer.from_file(tokenizer_path or hf_dir)
  check_tokenizer(hf_dir, cfg, tokenizer, f"tokenizer {tokenizer_path or hf_dir}")
  return cfg, params, tokenizer


def read_data(data, cfg, *, split: str = "train", max_items: int | None = None,
              columns: readers.Columns | None = None):
  """An image set (a prepared dataset directory or a .npz) for an image encoder, else text
  (features.read_dataset; `columns`: a CSV / TSV's). `max_items`: sentences or images."""
  if cfg.input_kind == "image":
    if not (pathlib.Path(data).is_dir() or str(data).lower().endswith(".npz")):
      raise ValueError(f"--data {data}: an image encoder takes a prepared image_arrays "
                       "dataset directory or a .npz of images and labels")
    return images.read_dataset(data, split=split, max_images=max_items)
  return features.read_dataset(data, max_sentences=max_items, columns=columns)
