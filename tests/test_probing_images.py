"""Probing image encoders: a Hugging Face ViT directory or an image train.py run, over a
.npz or a prepared image_arrays dataset (jaxencoder.probing.images and the probe CLI)."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest

import train_helpers as th
from jaxencoder.pretrained import vit
from jaxencoder.probing import __main__ as probe
from jaxencoder.probing import command, images
from jaxencoder.train.config import encoder_config
from jaxencoder.train.loop import train_and_evaluate
from test_pretrained_vit import init_params, tiny_vit

REPO = pathlib.Path(__file__).resolve().parents[1]


def colour_images(path, n: int = 60, size: int = 32, seed: int = 0) -> pathlib.Path:
  """A .npz of `n` noisy uint8 images; label k ("red", "green", "blue") = channel k bright."""
  rng = np.random.default_rng(seed)
  labels = np.arange(n) % 3
  images_NxHxWxC = rng.integers(0, 120, (n, size, size, 3))
  images_NxHxWxC[np.arange(n), :, :, labels] += 120
  np.savez(path, images=images_NxHxWxC.astype(np.uint8), labels=labels,
           label_names=np.array(["red", "green", "blue"]))
  return path


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory):
  """A tiny random ViTModel directory: 2 layers, 32x32x3 images, 8x8 patches."""
  path = tmp_path_factory.mktemp("vit")
  cfg = tiny_vit()
  vit.save(path, cfg, init_params(cfg))
  return path


def run_probe(*args) -> dict:
  return probe.main([*map(str, args), "--max-epochs", "20", "--batch-size", "16"])


def test_probe_cli_on_a_vit_directory_reports_every_layer(vit_dir, tmp_path):
  data = colour_images(tmp_path / "colours.npz")
  rep = run_probe("--pretrained", vit_dir, "--data", data, "--out", tmp_path / "out")
  saved = json.loads((tmp_path / "out" / "report.json").read_text())
  assert len(saved["probes"]["linear"]["layers"]) == tiny_vit().num_layers + 1
  assert len(saved["representation"]) == tiny_vit().num_layers + 1
  assert saved["model"]["family"] == "vit" and saved["labels"] == ["blue", "green", "red"]
  assert saved["input"]["kind"] == "image" and saved["input"]["pool"] == "cls"
  assert saved["input"]["normalisation"]["mean"] == [0.5]
  assert "ViTImageProcessor defaults" in saved["input"]["normalisation"]["source"]
  assert np.array(saved["attention"]["entropy"]).shape == (2, 4)
  assert saved["data"]["images"] == 60 and rep["tokenizer"] is None
  assert (tmp_path / "out" / "attention_entropy.png").exists()


def test_a_label_in_the_pixels_is_decodable_at_the_embedding_layer(vit_dir, tmp_path):
  """Colour survives the patch embedding's mean over patches: a linear probe reads it."""
  data = colour_images(tmp_path / "colours.npz")
  rep = run_probe("--pretrained", vit_dir, "--data", data, "--out", tmp_path / "out",
                  "--pool", "mean", "--seed", "1")
  layers = rep["probes"]["linear"]["layers"]
  assert layers[0]["accuracy"] >= 0.8, layers  # chance: 1/3


def test_a_labels_images_shuffled_probe_near_chance(vit_dir, tmp_path):
  """The same images with labels unrelated to them: no layer decodes them."""
  data = colour_images(tmp_path / "colours.npz")
  with np.load(data) as npz:
    arrays = dict(npz)
  arrays["labels"] = np.random.default_rng(5).permutation(arrays["labels"])
  np.savez(tmp_path / "shuffled.npz", **arrays)
  rep = run_probe("--pretrained", vit_dir, "--data", tmp_path / "shuffled.npz",
                  "--out", tmp_path / "out", "--pool", "mean")
  assert rep["probes"]["linear"]["layers"][0]["accuracy"] < 0.8


def test_preprocessor_config_sets_the_normalisation(tmp_path):
  (tmp_path / "preprocessor_config.json").write_text(json.dumps(
      {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225],
       "rescale_factor": 1 / 255}))
  norm = images.hf_normalisation(tmp_path)
  np.testing.assert_allclose(norm.mean, [0.485, 0.456, 0.406])
  np.testing.assert_allclose(norm.std, [0.229, 0.224, 0.225])
  (tmp_path / "preprocessor_config.json").write_text(json.dumps(
      {"do_normalize": False, "rescale_factor": 1 / 127.5}))
  norm = images.hf_normalisation(tmp_path)  # x / 127.5 == (x / 255 - 0) / 0.5
  np.testing.assert_allclose((norm.mean, norm.std), ([0.0], [0.5]))


def test_features_are_the_encoder_on_pipeline_normalised_images(vit_dir, tmp_path):
  import jax.numpy as jnp
  from jaxencoder import Encoder
  cfg, params, _ = vit.load(vit_dir)
  dataset = images.read_dataset(colour_images(tmp_path / "c.npz", n=5))
  feats = images.extract(cfg, params, dataset, batch_size=4, pool="mean")
  x_BxHxWxC = (dataset.images.astype(np.float32) / 255 - 0.5) / 0.5
  out = Encoder(cfg).apply({"params": params}, jnp.asarray(x_BxHxWxC), output_hidden_states=True)
  for n, h_BxLxD in enumerate(out.hidden_states):
    np.testing.assert_allclose(feats.layers[n], np.asarray(h_BxLxD)[:, 1:].mean(1), atol=1e-5)


def test_streamed_image_features_load_back_equal(vit_dir, tmp_path):
  from jaxencoder.probing import features
  cfg, params, _ = vit.load(vit_dir)
  dataset = images.read_dataset(colour_images(tmp_path / "c.npz", n=7))
  in_memory = images.extract(cfg, params, dataset, batch_size=4)
  images.extract(cfg, params, dataset, batch_size=4, out_dir=tmp_path / "feats")
  loaded = features.load_features(tmp_path / "feats")
  for n in range(cfg.num_layers + 1):
    np.testing.assert_array_equal(loaded.layers[n], in_memory.layers[n])
  assert loaded.label_names == in_memory.label_names and loaded.info["level"] == "image"
  np.testing.assert_allclose(loaded.attention["entropy"], in_memory.attention["entropy"])


def test_images_of_another_size_name_both_sizes_and_image_size_loading_fixes_it(
    vit_dir, tmp_path, caplog):
  data = colour_images(tmp_path / "small.npz", n=30, size=16)
  with pytest.raises(SystemExit):
    run_probe("--pretrained", vit_dir, "--data", data, "--out", tmp_path / "out")
  with pytest.raises(ValueError, match=r"images are 16x16 but the model takes image_size="
                                       r"\(32, 32\): load it with --image-size 16,16"):
    cfg, params, _ = vit.load(vit_dir)
    images.extract(cfg, params, images.read_dataset(data))
  rep = run_probe("--pretrained", vit_dir, "--data", data, "--out", tmp_path / "out",
                  "--image-size", "16,16")
  assert rep["data"]["image_size"] == [16, 16]
  assert "position table resized" in caplog.text


def test_a_text_file_for_an_image_encoder_is_refused(vit_dir, tmp_path):
  (tmp_path / "s.csv").write_text("text,label\na,b\n")
  with pytest.raises(ValueError, match="image encoder takes a prepared image_arrays"):
    command.probe(probe.parse_args(["--pretrained", str(vit_dir), "--data",
                                    str(tmp_path / "s.csv"), "--out", str(tmp_path / "out")]))


def vit_fashion_mnist_tiny(root: pathlib.Path):
  """configs/vit_fashion_mnist.py shrunk: 2 layers, 8x8 images, its stem (4x4 pixels a
  token) and 1x1 patches, 3 steps."""
  spec = importlib.util.spec_from_file_location("vit_fm", REPO / "configs/vit_fashion_mnist.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.model = th.model_config(encoder_config(config).replace(
      image_size=(8, 8), patch_size=1, num_layers=2, emb_dim=32, num_heads=4, mlp_dim=64))
  config.data.source, config.data.data_dir = th.image_set(root), str(root)
  config.num_classes = 3
  config.batch_size = config.eval_batch_size = 8
  config.num_train_steps = config.checkpoint_every = config.eval_every = 3
  config.optim.warmup_steps = 1
  config.progress_bar = False
  return config


@pytest.mark.slow
def test_an_image_run_probes_via_checkpoint(tmp_path):
  config = vit_fashion_mnist_tiny(tmp_path)
  train_and_evaluate(config, tmp_path / "run")
  rep = run_probe("--checkpoint", tmp_path / "run", "--data", config.data.source,
                  "--out", tmp_path / "out", "--split", "train")
  assert len(rep["probes"]["linear"]["layers"]) == 3
  assert rep["data"]["images"] == 32 and rep["input"]["kind"] == "image"
  assert rep["input"]["normalisation"]["source"].startswith("jaxencoder.data.pipeline")
  assert "training_health" in rep


def test_a_npz_reads_pixels_and_labels_by_the_rules_prepare_uses(tmp_path):
  """Float [0, 1] pixels are scaled (as prepare does), uint16 8-bit-looking pixels and a
  fractional label are refused naming the file; nothing is wrapped or truncated."""
  from jaxencoder.data.readers import DataError
  bytes_NxHxWxC = np.load(colour_images(tmp_path / "u8.npz"))["images"]
  labels = np.arange(len(bytes_NxHxWxC)) % 3
  np.savez(tmp_path / "unit.npz", images=bytes_NxHxWxC / 255.0, labels=labels.astype(float))
  unit = images.read_dataset(tmp_path / "unit.npz")
  np.testing.assert_array_equal(unit.images, bytes_NxHxWxC)
  assert unit.labels[:3] == ["0", "1", "2"]
  np.savez(tmp_path / "u16.npz", images=bytes_NxHxWxC.astype(np.uint16), labels=labels)
  with pytest.raises(DataError, match=r"u16.npz: images: uint16 images with values"):
    images.read_dataset(tmp_path / "u16.npz")
  np.savez(tmp_path / "frac.npz", images=bytes_NxHxWxC, labels=labels + 0.7)
  with pytest.raises(DataError, match=r"frac.npz: labels: label 0.7 at index 0 is not an "
                                      "integer"):
    images.read_dataset(tmp_path / "frac.npz")
