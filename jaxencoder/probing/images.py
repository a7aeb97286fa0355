"""Per-layer features of an image set: the [CLS] vector (or mean of patch tokens) of every layer.

  dataset = images.read_dataset("fashion_mnist_dir/")     # or a .npz: images, labels
  feats = images.extract(cfg, params, dataset, norm=images.hf_normalisation(HF_DIR))

Images are normalised by `data.pipeline.image_pipeline` itself, x/255 then
(x - mean) / std, so a train.py run is probed on the inputs it was trained on; a
Hugging Face ViT gets its preprocessor_config.json values folded into mean and std
(ViTImageProcessor's defaults without one). Images are never resized: a size other than
the model's is an error that suggests loading with `--image-size` (position grid resampled).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np

from jaxencoder import progress as progress_lib
from jaxencoder.model.config import EncoderConfig
from jaxencoder.data import pipeline, readers, sources
from jaxencoder.data.pipeline import Reading
from jaxencoder.model.encoder import Encoder
from jaxencoder.probing import attention_stats, store
from jaxencoder.probing.features import Features, extracting_desc

POOLS = ("cls", "mean")
IMAGE_STATS = ("entropy", "cls", "distance", "sparsity")  # no [SEP] or punctuation in images
PREPROCESSOR = "preprocessor_config.json"
HF_MEAN, HF_STD, HF_RESCALE = 0.5, 0.5, 1 / 255  # ViTImageProcessor's defaults


@dataclasses.dataclass
class ImageDataset:
  """Images with one label each; `level` "image" tells it from a text `features.Dataset`."""
  images: np.ndarray  # [S, H, W, C] (or [S, H, W]) uint8, or float on the same 0..255 scale
  labels: list  # a label name per image
  origin: str = ""
  level: str = "image"

  def __len__(self) -> int:
    return len(self.images)


@dataclasses.dataclass(frozen=True)
class Normalisation:
  """model input = (x / 255 - mean) / std per channel, x the 0..255 pixel (as image_pipeline)."""
  mean: tuple[float, ...]
  std: tuple[float, ...]
  source: str  # where the values come from, for the report


def training_normalisation() -> Normalisation:
  """What train.py feeds an image run: image_pipeline's own defaults (train.py passes none)."""
  defaults = inspect.signature(pipeline.image_pipeline).parameters
  return Normalisation((float(defaults["mean"].default),), (float(defaults["std"].default),),
                       "jaxencoder.data.pipeline.image_pipeline (as train.py)")


def hf_normalisation(hf_dir) -> Normalisation:
  """A HF image directory's preprocessor_config.json (image_mean / image_std /
  rescale_factor, do_rescale / do_normalize), folded into our x/255 form; without the
  file, ViTImageProcessor's defaults (rescale 1/255, mean 0.5, std 0.5)."""
  file = pathlib.Path(hf_dir) / PREPROCESSOR
  if not file.is_file():
    return Normalisation((HF_MEAN,), (HF_STD,), "ViTImageProcessor defaults (no "
                         f"{PREPROCESSOR})")
  conf = json.loads(file.read_text())
  rescale = conf.get("rescale_factor", HF_RESCALE) if conf.get("do_rescale", True) else 1.0
  mean, std = np.atleast_1d(conf.get("image_mean", HF_MEAN)), np.atleast_1d(
      conf.get("image_std", HF_STD))
  if not conf.get("do_normalize", True):
    mean, std = np.zeros(1), np.ones(1)
  scale = 255.0 * rescale  # (x * r - m) / s == (x / 255 - m / (255 r)) / (s / (255 r))
  return Normalisation(tuple(float(m) for m in mean / scale),
                       tuple(float(s) for s in std / scale), str(file))


def read_dataset(path, *, split: str = "train", max_images: int | None = None) -> ImageDataset:
  """A prepared image_arrays dataset directory (`python -m jaxencoder.data`; its `split`)
  or a `.npz` of `images` [N, H, W(, C)] and `labels` [N] (+ optional `label_names`),
  pixels and labels read by the rules `prepare` uses (readers.PIXEL_RULE, integer labels)."""
  path = pathlib.Path(path)
  if path.suffix.lower() == ".npz":
    with np.load(path, allow_pickle=False) as npz:
      if "images" not in npz or "labels" not in npz:
        raise ValueError(f"{path}: an image .npz needs arrays 'images' and 'labels', "
                         f"has {sorted(npz.files)}")
      images = readers.pixel_bytes(npz["images"][:max_images], f"{path}: images")
      ids = readers.integer_labels(npz["labels"][:max_images], f"{path}: labels")
      names = [str(n) for n in npz["label_names"]] if "label_names" in npz else None
  else:
    src = sources.open_source(str(path), split)
    rows = src.__getitems__(list(range(min(len(src), max_images or len(src)))))
    images = np.stack([np.asarray(r["image"]) for r in rows])
    ids = np.array([int(r["label"]) for r in rows])
    names = sources.label_names(str(path))
  labels = [names[int(i)] if names else str(int(i)) for i in ids]
  return ImageDataset(images, labels, str(path))


def check_size(cfg: EncoderConfig, dataset: ImageDataset) -> None:
  """Raises a ValueError naming both sizes when the images do not fit the model."""
  height, width = dataset.images.shape[1:3]
  channels = dataset.images.shape[3] if dataset.images.ndim == 4 else 1
  if (height, width) != tuple(cfg.image_size):
    raise ValueError(
        f"the images are {height}x{width} but the model takes image_size={tuple(cfg.image_size)}"
        f": load it with --image-size {height},{width} (resamples its position grid; "
        "interpolated positions are untrained) or resize the images yourself")
  if channels != cfg.num_channels:
    raise ValueError(f"the images have {channels} channels but the model takes "
                     f"num_channels={cfg.num_channels}")


class ImageExtractor:
  """Jitted forward: pooled hidden states of all layers (+ attention sums) per batch."""

  def __init__(self, cfg: EncoderConfig, params, *, pool: str, attention: bool = True,
               sparsity_threshold: float = 0.1):
    self.cfg, self.params, self.pool = cfg, params, pool
    self.attention = attention and cfg.attention_impl != "linear"
    self.sparsity_threshold = sparsity_threshold
    self.forward = jax.jit(self._forward)

  def _forward(self, params, images_BxHxWxC, weights_B):
    out = Encoder(self.cfg).apply({"params": params}, images_BxHxWxC, output_hidden_states=True,
                                  output_attentions=self.attention)
    h_NxBxLxD = jnp.stack(out.hidden_states).astype(jnp.float32)
    first_patch = int(self.cfg.use_cls_token)
    pooled_NxBxD = (h_NxBxLxD[:, :, 0] if self.pool == "cls"
                    else h_NxBxLxD[:, :, first_patch:].mean(2))
    if not self.attention:
      return pooled_NxBxD, None
    length = h_NxBxLxD.shape[2]
    mask_BxL = jnp.broadcast_to(weights_B[:, None] > 0, (weights_B.shape[0], length))
    cls_BxL = mask_BxL & (jnp.arange(length) < first_patch)[None]
    groups = {"cls": cls_BxL, "sep": jnp.zeros_like(mask_BxL), "punct": jnp.zeros_like(mask_BxL)}
    sums = [attention_stats.head_sums(p.astype(jnp.float32), mask_BxL, groups,
                                      self.sparsity_threshold) for p in out.attentions]
    return pooled_NxBxD, {k: jnp.stack([s[k] for s in sums]) for k in sums[0]}


def extract(cfg: EncoderConfig, params, dataset: ImageDataset, *,
            norm: Normalisation | None = None, pool: str | None = None, batch_size: int = 32,
            out_dir=None, attention: bool = True, sparsity_threshold: float = 0.1,
            progress: bool = True) -> Features:
  """Pooled features of every layer (N + 1) for each image, + attention means per layer
  and head. pool: "cls" (default with a [CLS] vector) or "mean" of patch tokens.
  `progress`: a bar (or plain lines) over the batches, on stderr."""
  if cfg.input_kind != "image":
    raise ValueError(f"image data needs an image encoder, got input_kind={cfg.input_kind!r}")
  pool = pool or ("cls" if cfg.use_cls_token else "mean")
  if pool not in POOLS or (pool == "cls" and not cfg.use_cls_token):
    raise ValueError(f"pool={pool!r} for images; choose from "
                     f"{POOLS if cfg.use_cls_token else ('mean',)} (cls needs a [CLS] vector)")
  if not len(dataset):
    raise ValueError("extract: the dataset has no images")
  check_size(cfg, dataset)
  norm = norm or training_normalisation()
  labels_M, names = _label_ids(dataset.labels)
  rows = [{"image": image, "label": label} for image, label in zip(dataset.images, labels_M)]
  batches = pipeline.image_pipeline(rows, batch_size=batch_size,
                                    mean=np.asarray(norm.mean, np.float32),
                                    std=np.asarray(norm.std, np.float32), read=Reading(seed=None))
  extractor = ImageExtractor(cfg, params, pool=pool, attention=attention,
                             sparsity_threshold=sparsity_threshold)
  layers = store.allocate(cfg.num_layers + 1, len(dataset), cfg.emb_dim, out_dir)
  batches = progress_lib.track(batches, extracting_desc(len(layers)), unit="batch",
                               total=-(-len(dataset) // batch_size), enabled=progress)
  totals = _run_batches(extractor, batches, layers)
  means = None if totals is None else {
      k: v for k, v in attention_stats.head_means(totals).items() if k in IMAGE_STATS}
  info = {"level": "image", "pool": pool, "images": len(dataset), "items": len(dataset),
          "image_size": list(dataset.images.shape[1:3]),
          "normalisation": dataclasses.asdict(norm)}
  feats = Features(layers, labels_M, names, np.arange(len(dataset)), None, means, info)
  if out_dir is not None:
    store.save(feats, out_dir)
  return feats


def _run_batches(extractor: ImageExtractor, batches, layers):
  """Writes each batch's real rows (fill rows come last) into `layers`; attention sums."""
  totals, start = None, 0
  for batch in batches:
    pooled_NxBxD, sums = extractor.forward(extractor.params, batch["images"],
                                           batch["example_weights"])
    pooled_NxBxD, count = np.asarray(pooled_NxBxD), int(batch["example_weights"].sum())
    for n, layer in enumerate(layers):
      layer[start:start + count] = pooled_NxBxD[n, :count]
    start += count
    sums = None if sums is None else jax.device_get(sums)
    totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
  return totals


def _label_ids(labels) -> tuple[np.ndarray, list[str]]:
  names = sorted(set(labels))
  index = {name: i for i, name in enumerate(names)}
  return np.array([index[t] for t in labels], np.int32), names
