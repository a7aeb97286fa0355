"""What a probing study reads: the model, from a run directory or a Hugging Face directory
(`(cfg, params, tokenizer)`), and the data it probes, text or images."""

from __future__ import annotations

import pathlib

from jaxencoder import pretrained
from jaxencoder.data import readers
from jaxencoder.io.run_dir import RunDir
from jaxencoder.pretrained.hf_checkpoint import check_tokenizer, resize_on_load
from jaxencoder.probing import features, images
from jaxencoder.model.restore_targets import stored_config, stored_encoder
from jaxencoder.tokenizer import Tokenizer, check_fits, run_tokenizer


def load_checkpoint(workdir, tokenizer_path: str | None = None, **resize):
  """(cfg, params, tokenizer) of a run directory's newest checkpoint that restores (a
  train.py workdir or a converted checkpoint; local or gs://); tokenizer None for image
  encoders. `resize`: max_len / image_size, as `pretrained.load`."""
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
  cfg, params, tokenizer = pretrained.load(hf_dir, **resize)
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
