"""What a probing study reads: the model, from a run directory or a Hugging Face directory
(`(cfg, params, tokenizer)`), and the data it probes, text or images."""

from __future__ import annotations

import pathlib

from jaxencoder import pretrained
from jaxencoder.data import readers
from jaxencoder.pretrained.convert import read_run
from jaxencoder.pretrained.hf_checkpoint import check_tokenizer
from jaxencoder.pretrained import resolver
from jaxencoder.probing import features, images
from jaxencoder.tokenizer import Tokenizer


def load_checkpoint(workdir, tokenizer_path: str | None = None, **resize):
  """(cfg, params, tokenizer) of a run directory's newest checkpoint that restores, or of
  RUN@STEP (resolver.resolve; a Hugging Face directory or name: `load_pretrained`);
  tokenizer None for image encoders. `resize`: max_len / image_size, as `pretrained.load`."""
  where = resolver.resolve(workdir)
  if where.kind == "hf":
    return load_pretrained(where.path, tokenizer_path, **resize)
  return read_run(where.path, tokenizer_path, step=where.step, **resize)


def load_pretrained(hf_dir, tokenizer_path: str | None = None, **resize):
  """(cfg, params, tokenizer) of a Hugging Face encoder dir or a registered name ("minilm",
  via jaxencoder.pretrained); tokenizer None for image encoders. `resize`: max_len /
  image_size, as `pretrained.load`."""
  hf_dir = resolver.hf_dir(hf_dir, "--pretrained", "--checkpoint reads runs")
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
