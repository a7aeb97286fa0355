"""Features on disk: one `layer_NN.npy` per layer (written as memmaps), plus labels and meta.

  out_dir/layer_00.npy … layer_NN.npy   # [M, D] float32
  out_dir/labels.npy, sentence_ids.npy  # [M] int32 / int64
  out_dir/meta.json                     # label names, word types, info, attention means
"""

from __future__ import annotations

import json
import pathlib

import numpy as np


def allocate(num_layers: int, items: int, dim: int, out_dir=None) -> list[np.ndarray]:
  """N + 1 zeroed [M, D] arrays: in memory, or `.npy` memmaps under `out_dir`."""
  if out_dir is None:
    return [np.zeros((items, dim), np.float32) for _ in range(num_layers)]
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  return [np.lib.format.open_memmap(out_dir / f"layer_{n:02d}.npy", mode="w+",
                                    dtype=np.float32, shape=(items, dim))
          for n in range(num_layers)]


def save(feats, out_dir) -> None:
  """Flushes the layer memmaps and writes labels, sentence ids and meta.json."""
  out_dir = pathlib.Path(out_dir)
  for layer in feats.layers:
    if isinstance(layer, np.memmap):
      layer.flush()
  np.save(out_dir / "labels.npy", feats.labels_M)
  np.save(out_dir / "sentence_ids.npy", feats.sentence_ids_M)
  attention = None if feats.attention is None else {
      k: np.asarray(v).tolist() for k, v in feats.attention.items()}
  meta = {"label_names": feats.label_names, "types": feats.types, "info": feats.info,
          "attention": attention, "num_layers": len(feats.layers)}
  (out_dir / "meta.json").write_text(json.dumps(meta))


def load(out_dir) -> dict:
  """The fields of a saved `Features`; layers come back as read-only memmaps."""
  out_dir = pathlib.Path(out_dir)
  meta = json.loads((out_dir / "meta.json").read_text())
  attention = meta["attention"]
  return {"layers": [np.load(out_dir / f"layer_{n:02d}.npy", mmap_mode="r")
                     for n in range(meta["num_layers"])],
          "labels_M": np.load(out_dir / "labels.npy"),
          "label_names": meta["label_names"],
          "sentence_ids_M": np.load(out_dir / "sentence_ids.npy"),
          "types": meta["types"], "info": meta["info"],
          "attention": None if attention is None else {
              k: np.asarray(v) for k, v in attention.items()}}
