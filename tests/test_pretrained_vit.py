"""jaxencoder.pretrained.vit: HF ViT checkpoints in and out, parity with PyTorch, and
checkpoint position tables resized (jaxencoder.pretrained.resize).

The `live` tests build small random transformers ViT models here and skip without torch
(make parity runs them with --no-skips).
"""

import json
import logging

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import tiny_config
from jaxencoder import Encoder
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.embeddings import patchify
from jaxencoder.model.stack_layout import scan_to_loop
from jaxencoder.model.positions import resample_position_grid, resample_position_table
from jaxencoder.pretrained import vit
from jaxencoder.pretrained.resize import resize_positions

PARITY_ATOL = 1e-4  # float32 on CPU, max-abs over every element


def tiny_vit(**overrides) -> EncoderConfig:
  """A 2-layer, 32-wide ViT on 32x32x3 images, 8x8 patches (a 4x4 grid + [CLS])."""
  fields = dict(input_kind="image", image_size=(32, 32), patch_size=8, num_channels=3,
                type_vocab_size=0, num_layers=2, emb_dim=32, num_heads=4, mlp_dim=64,
                embedding_norm=False, norm_position="pre", pooler_dense=True,
                dropout_rate=0.0, attention_dropout_rate=0.0, family="vit")
  fields.update(overrides)
  return EncoderConfig(**fields)


def init_params(cfg: EncoderConfig, seed: int = 0):
  """Unboxed Encoder params: of a ViT from images, of a text encoder from ids."""
  if cfg.input_kind == "text":
    example = jnp.ones((1, 4), jnp.int32)
  else:
    example = jnp.zeros((1, *cfg.image_size, cfg.num_channels))
  return nn.meta.unbox(Encoder(cfg).init(jax.random.key(seed), example)["params"])


def random_images(seed: int, cfg: EncoderConfig, size=None) -> np.ndarray:
  """[B, H, W, C] float32 in [-1, 1]."""
  height, width = size or cfg.image_size
  rng = np.random.default_rng(seed)
  return rng.uniform(-1, 1, (3, height, width, cfg.num_channels)).astype(np.float32)


def run_encoder(cfg, params, images_BxHxWxC):
  out = jax.jit(Encoder(cfg).apply)({"params": params}, jnp.asarray(images_BxHxWxC))
  return np.asarray(out.last_hidden_state), np.asarray(out.pooled)


# ------------------------------------------------------------------ no torch
def test_save_then_load_gives_identical_params_and_config(tmp_path):
  cfg = tiny_vit()
  params = init_params(cfg)
  vit.save(tmp_path, cfg, params)
  loaded_cfg, loaded, tokenizer = vit.load(tmp_path)
  assert tokenizer is None and loaded_cfg == cfg
  chex.assert_trees_all_equal(loaded, params)
  scanned_cfg, scanned, _ = vit.load(tmp_path, scan_layers=True)
  assert scanned_cfg.scan_layers and "layers" in scanned
  chex.assert_trees_all_equal(scan_to_loop(scanned), params)
  vit.save(tmp_path / "again", scanned_cfg, scanned)  # a scanned stack saves the same file
  first, again = load_file(str(tmp_path / "model.safetensors")), load_file(
      str(tmp_path / "again" / "model.safetensors"))
  chex.assert_trees_all_equal(first, again)


def test_saved_config_json_is_a_vit_config(tmp_path):
  cfg = tiny_vit(image_size=(32, 24), num_channels=1, norm_eps=1e-6)
  vit.save(tmp_path, cfg, init_params(cfg))
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["model_type"] == "vit" and config["architectures"] == ["ViTModel"]
  assert config["image_size"] == [32, 24] and config["patch_size"] == 8
  assert config["num_channels"] == 1 and config["layer_norm_eps"] == 1e-6
  tensors = load_file(str(tmp_path / "model.safetensors"))
  assert tensors["embeddings.patch_embeddings.projection.weight"].shape == (32, 1, 8, 8)
  assert tensors["embeddings.position_embeddings"].shape == (1, 1 + 4 * 3, 32)
  assert tensors["embeddings.cls_token"].shape == (1, 1, 32)


def test_patch_kernel_reproduces_the_conv_on_channels_first_images(tmp_path):
  """Our patchify @ kernel equals HF's Conv2d(stride = patch) on [B, C, H, W] pixels."""
  cfg = tiny_vit()
  vit.save(tmp_path, cfg, init_params(cfg))
  tensors = load_file(str(tmp_path / "model.safetensors"))
  weight_DxCxPxP = tensors["embeddings.patch_embeddings.projection.weight"]
  images_BxHxWxC = random_images(0, cfg)
  pixels_BxCxHxW = images_BxHxWxC.transpose(0, 3, 1, 2)
  b, c, h, w = pixels_BxCxHxW.shape
  blocks = pixels_BxCxHxW.reshape(b, c, h // 8, 8, w // 8, 8)  # [B, C, gh, y, gw, x]
  conv_BxDxGHxGW = np.einsum("bciyjx,dcyx->bdij", blocks, weight_DxCxPxP)
  conv_BxPxD = conv_BxDxGHxGW.reshape(b, 32, -1).transpose(0, 2, 1)  # flatten(2).T
  kernel = vit.load(tmp_path)[1]["embeddings"]["patch_embed"]["kernel"]
  ours_BxPxD = np.asarray(patchify(jnp.asarray(images_BxHxWxC), 8) @ kernel)
  np.testing.assert_allclose(ours_BxPxD, conv_BxPxD, atol=1e-5)


def test_unsupported_config_options_are_named_in_one_error(tmp_path):
  cfg = tiny_vit()
  vit.save(tmp_path, cfg, init_params(cfg))
  config = json.loads((tmp_path / "config.json").read_text())
  config.update(qkv_bias=False, pooler_act="relu", encoder_stride=4)  # stride: irrelevant
  (tmp_path / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="does not support") as info:
    vit.load(tmp_path)
  assert "qkv_bias=False" in str(info.value) and "pooler_act='relu'" in str(info.value)
  assert "encoder_stride" not in str(info.value)


def test_missing_and_unexpected_tensors_are_named(tmp_path):
  cfg = tiny_vit()
  vit.save(tmp_path, cfg, init_params(cfg))
  tensors = load_file(str(tmp_path / "model.safetensors"))
  del tensors["layernorm.weight"]
  tensors["encoder.layer.0.extra"] = np.zeros(3, np.float32)
  save_file(tensors, str(tmp_path / "model.safetensors"))
  with pytest.raises(ValueError, match=r"missing: \['layernorm.weight'\].*"
                                       r"unexpected: \['encoder.layer.0.extra'\]"):
    vit.load(tmp_path)


def test_save_names_every_field_a_vit_cannot_hold(tmp_path):
  cfg = tiny_config(pooler_dense=True)  # a BERT: text, post-norm, embedding LayerNorm
  params = init_params(cfg)
  with pytest.raises(ValueError, match="no ViTModel equivalent") as info:
    vit.save(tmp_path, cfg, params)
  for field in ("input_kind='text'", "embedding_norm=True", "norm_position='post'"):
    assert field in str(info.value)
  with pytest.raises(ValueError, match="no tokenizer"):
    vit.save(tmp_path, tiny_vit(), init_params(tiny_vit()), tokenizer=object())


def test_load_at_another_image_size_resamples_the_grid_and_warns(tmp_path, caplog):
  cfg = tiny_vit()
  params = init_params(cfg)
  vit.save(tmp_path, cfg, params)
  with caplog.at_level(logging.WARNING):
    big_cfg, big, _ = vit.load(tmp_path, image_size=(48, 40))
  assert "image_size (32, 32) -> (48, 40)" in caplog.text
  assert big_cfg.image_size == (48, 40) and big_cfg.patch_grid == (6, 5)
  table = big["embeddings"]["position_embed"]["embedding"]
  old = params["embeddings"]["position_embed"]["embedding"]
  assert table.shape == (1 + 30, 32)
  np.testing.assert_array_equal(table[0], old[0])  # [CLS] position kept
  np.testing.assert_array_equal(table, resample_position_grid(old, (4, 4), (6, 5), "bicubic"))
  last, _ = run_encoder(big_cfg, big, random_images(0, big_cfg))
  assert last.shape == (3, 31, 32) and np.isfinite(last).all()
  with pytest.raises(ValueError, match="differs from image_size"):  # the default refuses
    run_encoder(cfg, params, random_images(0, big_cfg))


def test_text_table_extends_by_interpolation_only_when_asked(caplog):
  cfg = tiny_config(max_len=16)
  params = init_params(cfg)
  ids_BxL = jnp.ones((1, 30), jnp.int32)
  with pytest.raises(ValueError, match=r"longer than the position table \(max_len=16"):
    Encoder(cfg).apply({"params": params}, ids_BxL)
  with caplog.at_level(logging.WARNING):
    long_cfg, long_params = resize_positions(cfg, params, max_len=31)
  assert "max_len 16 -> 31" in caplog.text and long_cfg.max_len == 31
  old, new = (p["embeddings"]["position_embed"]["embedding"] for p in (params, long_params))
  np.testing.assert_allclose(new[::2], old, atol=1e-6)  # 16 -> 31 rows: old row i at 2i
  np.testing.assert_allclose(new[1], (old[0] + old[1]) / 2, atol=1e-6)
  assert Encoder(long_cfg).apply({"params": long_params}, ids_BxL).last_hidden_state.shape == (
      1, 30, 32)


def test_text_resize_keeps_the_position_offset_rows():
  cfg = tiny_config(max_len=10, position_offset=2)
  params = init_params(cfg)
  _, resized = resize_positions(cfg, params, max_len=18)
  old, new = (p["embeddings"]["position_embed"]["embedding"] for p in (params, resized))
  np.testing.assert_array_equal(new[:2], old[:2])
  np.testing.assert_array_equal(new[2:], resample_position_table(old[2:], 16))


def test_resize_refuses_what_it_cannot_resize():
  text = tiny_config(position_embedding="rope")
  with pytest.raises(ValueError, match="rope_scaling"):
    resize_positions(text, {}, max_len=128)
  with pytest.raises(ValueError, match="exactly one"):
    resize_positions(tiny_vit(), {}, max_len=3, image_size=(8, 8))
  with pytest.raises(ValueError, match="resizes image encoders"):
    resize_positions(tiny_config(), {}, image_size=(8, 8))


# ------------------------------------------------------------------ live (torch)
@pytest.fixture(scope="module")
def torch_transformers():
  return pytest.importorskip("torch"), pytest.importorskip("transformers")


def hf_vit(transformers, torch, num_channels=3, image_size=32, cls_name="ViTModel"):
  torch.manual_seed(0)
  config = transformers.ViTConfig(image_size=image_size, patch_size=8, hidden_size=64,
                                  num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=128, num_channels=num_channels)
  return getattr(transformers, cls_name)(config).eval()


def hf_outputs(torch, model, images_BxHxWxC, **kwargs):
  pixels = torch.as_tensor(images_BxHxWxC.transpose(0, 3, 1, 2))  # HF: [B, C, H, W]
  with torch.no_grad():
    out = model(pixel_values=pixels, **kwargs)
  return out.last_hidden_state.numpy(), out.pooler_output.numpy()


@pytest.mark.parametrize("num_channels", [3, 1])
def test_live_vit_matches_pytorch_both_ways(torch_transformers, tmp_path, num_channels):
  torch, transformers = torch_transformers
  hf_vit(transformers, torch, num_channels).save_pretrained(tmp_path / "hf")
  cfg, params, _ = vit.load(tmp_path / "hf")
  assert cfg.num_channels == num_channels and cfg.pooler_dense and cfg.family == "vit"
  images = random_images(1, cfg)
  vit.save(tmp_path / "ours", cfg, params)
  ours = run_encoder(cfg, params, images)
  for directory in ("hf", "ours"):
    model = transformers.ViTModel.from_pretrained(str(tmp_path / directory)).eval()
    theirs = hf_outputs(torch, model, images)
    assert np.abs(ours[0] - theirs[0]).max() < PARITY_ATOL  # last_hidden_state
    assert np.abs(ours[1] - theirs[1]).max() < PARITY_ATOL  # pooler_output


@pytest.mark.parametrize("size", [(48, 48), (48, 40), (16, 16)], ids=["up", "non_square", "down"])
def test_live_resampled_grid_matches_interpolate_pos_encoding(torch_transformers, tmp_path, size):
  """transformers' interpolate_pos_encoding: torch bicubic, align_corners=False, no antialias."""
  torch, transformers = torch_transformers
  model = hf_vit(transformers, torch)
  model.save_pretrained(tmp_path)
  cfg, params, _ = vit.load(tmp_path, image_size=size)
  images = random_images(2, cfg)
  ours = run_encoder(cfg, params, images)
  theirs = hf_outputs(torch, model, images, interpolate_pos_encoding=True)
  assert np.abs(ours[0] - theirs[0]).max() < PARITY_ATOL
  assert np.abs(ours[1] - theirs[1]).max() < PARITY_ATOL
  num_rows = 1 + cfg.patch_grid[0] * cfg.patch_grid[1]
  with torch.no_grad():  # the tables themselves: same resize, not just close outputs
    their_table = model.embeddings.interpolate_pos_encoding(torch.zeros(1, num_rows, 64), *size)
  table = params["embeddings"]["position_embed"]["embedding"]
  assert np.abs(np.asarray(table) - their_table[0].numpy()).max() < 1e-6


def test_live_image_classifier_loads_its_encoder_and_names_the_dropped_head(
    torch_transformers, tmp_path, caplog):
  torch, transformers = torch_transformers
  model = hf_vit(transformers, torch, cls_name="ViTForImageClassification")
  model.save_pretrained(tmp_path)
  with caplog.at_level(logging.WARNING):
    cfg, params, _ = vit.load(tmp_path)
  assert "classifier.weight" in caplog.text and not cfg.pooler_dense
  images = random_images(3, cfg)
  pixels = torch.as_tensor(images.transpose(0, 3, 1, 2))
  with torch.no_grad():
    theirs = model.vit(pixel_values=pixels).last_hidden_state.numpy()
  assert np.abs(run_encoder(cfg, params, images)[0] - theirs).max() < PARITY_ATOL



def test_pretrained_load_and_save_dispatch_to_vit(tmp_path):
  """jaxencoder.pretrained.load picks vit from config.json's model_type, save from cfg.family."""
  from jaxencoder.pretrained import load, save
  cfg = tiny_vit()
  params = init_params(cfg)
  save(tmp_path, cfg, params)
  assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "vit"
  loaded_cfg, loaded, tokenizer = load(tmp_path)
  assert loaded_cfg == cfg and tokenizer is None
  chex.assert_trees_all_equal(loaded, params)


def test_convert_cli_takes_a_vit_to_a_run_directory_and_back(tmp_path, capsys):
  from jaxencoder.pretrained.__main__ import main
  cfg = tiny_vit()
  vit.save(tmp_path / "hf", cfg, init_params(cfg))
  main(["convert", "--from", str(tmp_path / "hf"), "--to", str(tmp_path / "run")])
  assert "wrote jaxencoder checkpoint" in capsys.readouterr().out
  main(["convert", "--from", str(tmp_path / "run"), "--to", str(tmp_path / "back")])
  assert f"wrote Hugging Face ViT directory {tmp_path / 'back'}" in capsys.readouterr().out
  chex.assert_trees_all_equal(load_file(str(tmp_path / "back" / "model.safetensors")),
                              load_file(str(tmp_path / "hf" / "model.safetensors")))
