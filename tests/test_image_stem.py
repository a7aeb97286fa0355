"""A convolutional stem before the patch embedding (EncoderConfig.stem_channels), image
augmentation, and data/model mismatches named with the override that fixes them."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from jaxencoder import Encoder
from jaxencoder.model.config import EncoderConfig
from jaxencoder.data import pipeline
from jaxencoder.data.pipeline import Reading
from jaxencoder.model.embeddings import Embeddings
from jaxencoder.data.readers import DataError
from jaxencoder.pretrained import vit
from jaxencoder.data.splits import check_model_fits


def _stem_vit(**overrides) -> EncoderConfig:
  fields = dict(input_kind="image", image_size=(28, 28), patch_size=1, num_channels=1,
                stem_channels=(8, 16), stem_stride=2, type_vocab_size=0, num_layers=1,
                emb_dim=16, num_heads=2, mlp_dim=32, norm_position="pre", pooling="mean",
                dropout_rate=0.0, attention_dropout_rate=0.0)
  return EncoderConfig(**{**fields, **overrides})


def _init(cfg):
  images = jnp.zeros((2, *cfg.image_size, cfg.num_channels))
  return nn.meta.unbox(Encoder(cfg).init(jax.random.key(0), images)["params"])


@pytest.mark.slow
def test_a_strided_stem_sets_the_token_grid():
  cfg = _stem_vit()
  assert cfg.image_stride == 4 and cfg.patch_grid == (7, 7)
  params = _init(cfg)
  stem = params["embeddings"]
  assert stem["stem_0"]["kernel"].shape == (3, 3, 1, 8)
  assert stem["stem_1"]["kernel"].shape == (3, 3, 8, 16)
  assert stem["patch_embed"]["kernel"].shape == (16, 16)  # 1x1 patches of 16 channels
  out = Encoder(cfg).apply({"params": params}, jnp.ones((2, 28, 28, 1)))
  assert out.last_hidden_state.shape == (2, 1 + 49, 16)  # [CLS] + a 7x7 grid


def test_the_stem_is_local_a_pixel_moves_only_nearby_tokens():
  cfg = _stem_vit(use_cls_token=False, num_layers=1)
  params = _init(cfg)
  stem_only = lambda x: Embeddings(cfg).apply(
      {"params": params["embeddings"]}, x, jnp.ones((x.shape[0], 49), jnp.int32), None, None,
      None, deterministic=True)[0]
  x = np.random.default_rng(0).normal(size=(1, 28, 28, 1)).astype(np.float32)
  y = x.copy()
  y[0, 0, 0, 0] += 5.0  # the top-left pixel
  changed = np.abs(np.asarray(stem_only(y) - stem_only(x)))[0].max(axis=-1) > 1e-6
  grid = changed.reshape(7, 7)
  assert grid[0, 0] and not grid[2:, :].any() and not grid[:, 2:].any()


def test_stem_options_are_checked_by_name():
  with pytest.raises(ValueError, match="stem_channels=.* is for input_kind='image'"):
    EncoderConfig(input_kind="text", stem_channels=(8,))
  with pytest.raises(ValueError, match=r"not divisible by patch_size=4 x stem_stride=2\^1 = 8"):
    _stem_vit(patch_size=4, stem_channels=(8,), image_size=(28, 28))
  with pytest.raises(ValueError, match="stem_channels must be positive"):
    _stem_vit(stem_channels=(8, 0))


def test_a_stem_has_no_vit_checkpoint_equivalent(tmp_path):
  cfg = _stem_vit(family="vit")
  with pytest.raises(ValueError, match=r"no ViTModel equivalent.*stem_channels=\(8, 16\)"):
    vit.save(tmp_path, cfg, _init(cfg))


def test_augmentation_flips_and_shifts_keep_pixels_and_labels():
  images = np.arange(2 * 4 * 4, dtype=np.uint8).reshape(2, 4, 4)
  source = [{"image": images[i], "label": i} for i in range(2)]
  seen = set()
  for seed in range(60):  # 1 in 18 images is left as it is
    batch = next(iter(pipeline.image_pipeline(source, batch_size=2,
                                              random_flip=True, random_shift=1,
                                              read=Reading(seed=seed, shard_index=0,
                                                           shard_count=1))))
    for x, label in zip(batch["images"][..., 0], batch["labels"]):
      original = (images[label].astype(np.float32) / 255 - 0.5) / 0.5
      kept = set(np.round(x, 5).ravel()) - {-1.0}  # vacated pixels are black (0 -> -1)
      assert kept <= set(np.round(original, 5).ravel())  # only moved, never changed
      seen.add(bool(np.allclose(x, original)))
  assert seen == {True, False}  # some untouched, some augmented
  plain = next(iter(pipeline.image_pipeline(source, batch_size=2,
                                            read=Reading(seed=0, shard_index=0, shard_count=1))))
  assert sorted(np.round(plain["images"][..., 0].sum(axis=(1, 2)), 3).tolist()) == sorted(
      np.round(((images.astype(np.float32) / 255 - 0.5) / 0.5).sum(axis=(1, 2)), 3).tolist())


def _config(kind, source, **model):
  return ml_collections.ConfigDict({"data": {"kind": kind, "source": source},
                                    "model": model})


def test_a_series_with_other_channels_names_the_override():
  train = [{"series": np.zeros((5, 6), np.float32), "label": 0}]
  with pytest.raises(DataError, match=r"ucr/BasicMotions: its series have 6 channels per step "
                     r"but model.input_features=1: add --config.model.input_features=6"):
    check_model_fits(_config("time_series", "ucr/BasicMotions", input_features=1), "x", train)
  check_model_fits(_config("time_series", "ucr/BasicMotions", input_features=6), "x", train)


def test_images_of_another_shape_name_the_overrides():
  train = [{"image": np.zeros((32, 32, 3), np.uint8), "label": 0}]
  cfg = _config("image_arrays", "cifar", image_size=(28, 28), num_channels=1)
  with pytest.raises(DataError, match=r"its images are 32x32 with 3 channels .* add "
                     r"--config.model.num_channels=3 --config.model.image_size='\(32, 32\)'"):
    check_model_fits(cfg, "x", train)


def test_augmentation_depends_on_the_example_not_the_shard():
  images = np.arange(8 * 4 * 4, dtype=np.uint8).reshape(8, 4, 4)
  source = [{"image": images[i], "label": i} for i in range(8)]
  def by_label(**shard):
    out = {}
    for b in pipeline.image_pipeline(source, batch_size=2, random_flip=True, random_shift=1,
                                     read=Reading(seed=3, **shard)):
      out.update({int(y): x for y, x, w in zip(b["labels"], b["images"],
                                               b["example_weights"]) if w})
    return out
  whole = by_label(shard_index=0, shard_count=1)
  halves = {**by_label(shard_index=0, shard_count=2), **by_label(shard_index=1, shard_count=2)}
  assert sorted(whole) == list(range(8))
  for label in range(8):
    np.testing.assert_array_equal(whole[label], halves[label])
