"""A LoRA run's adapters as one small safetensors file (`jaxencoder-convert --adapters_only`),
and reading it back."""

from __future__ import annotations

import json
import pathlib

import jax
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from jaxencoder.model import lora
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.restore_targets import encoder_params, restore_encoder, stored_config

ADAPTERS_FILE = "adapters.safetensors"


def write_adapters(run, path: pathlib.Path) -> str:
  """A LoRA run's adapters as one safetensors file: '/'-joined paths in the Encoder's
  params (e.g. "layers_0/attention/query/lora_a") -> float32 arrays; its metadata "model"
  holds the run's EncoderConfig as JSON (lora_* fields included)."""
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
