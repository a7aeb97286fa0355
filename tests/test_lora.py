"""LoRA: adapters beside the block kernels, frozen base, merge, init_from, convert."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import train_helpers as th
from conftest import random_ids, tiny_config
from jaxencoder import Encoder
from jaxencoder.model import lora
from jaxencoder.model.config import block_kernels
from jaxencoder.io.run_dir import RunDir
from jaxencoder.model.layers import dense
from jaxencoder.pretrained.adapters_file import read_adapters
from jaxencoder.pretrained.convert import convert
from jaxencoder.model.restore_targets import (encoder_params, restore_encoder, stored_config,
                                        write_encoder)
from jaxencoder.model.stack_layout import loop_to_scan
from jaxencoder.train.init_from import restore_base
from jaxencoder.train.optim import make_optimizer, path_str, trainable_mask

LORA = dict(lora_rank=3, lora_alpha=6.0)


def _lora_params(cfg, seed: int = 0, nonzero_b: bool = True):
  """Unboxed Encoder params of cfg; B drawn at random (a trained adapter) if asked."""
  ids = random_ids(seed, (2, 8))
  params = nn.meta.unbox(Encoder(cfg).init(jax.random.key(seed), ids)["params"])
  params = jax.tree.map(np.asarray, params)
  if nonzero_b:
    keys = iter(jax.random.split(jax.random.key(seed + 1), 64))
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: np.asarray(0.1 * jax.random.normal(next(keys), x.shape))
        if path_str(p).endswith(lora.LORA_B) else x, params)
  return params, ids


def _apply(cfg, params, ids):
  return Encoder(cfg).apply({"params": params}, ids).last_hidden_state


def test_update_is_w_plus_scaled_a_times_b():
  cfg = tiny_config(**LORA)
  layer = dense(cfg, (4, 8), kernel_axes=("embed", "heads", "kv"), lora=True)
  x_BxLxD = np.asarray(jax.random.normal(jax.random.key(0), (2, 5, 32)))
  params = jax.tree.map(np.asarray, nn.meta.unbox(layer.init(jax.random.key(1), x_BxLxD)["params"]))
  params["lora_b"] = np.asarray(jax.random.normal(jax.random.key(2), (3, 4, 8)))
  params["bias"] = np.asarray(jax.random.normal(jax.random.key(3), (4, 8)))
  a_DxR, b_RxO = params["lora_a"], params["lora_b"].reshape(3, 32)
  w_DxO = params["kernel"].reshape(32, 32) + 6.0 / 3 * (a_DxR @ b_RxO)
  expected = (x_BxLxD.reshape(10, 32) @ w_DxO + params["bias"].reshape(32)).reshape(2, 5, 4, 8)
  got = layer.apply({"params": params}, x_BxLxD)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_adapters_sit_beside_their_kernels_with_its_logical_axes():
  cfg = tiny_config(**LORA, lora_targets="query|out")
  boxed = Encoder(cfg).init(jax.random.key(0), random_ids(0, (1, 8)))["params"]["layers_0"]
  attention = boxed["attention"]
  assert attention["query"]["lora_a"].names == ("embed", None)
  assert attention["query"]["lora_b"].names == (None, "heads", "kv")
  assert attention["out"]["lora_a"].names == ("heads", "kv", None)
  assert attention["out"]["lora_b"].names == (None, "embed")
  assert "lora_a" not in attention["key"] and "lora_a" not in boxed["ffn"]["wi"]


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_block_kernels_lists_the_kernels_of_a_real_block(activation):
  cfg = tiny_config(activation=activation)
  params = encoder_params(cfg)["layers_0"]
  found = {path_str(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)
           if path_str(p).endswith("/kernel")}
  assert found == set(block_kernels(cfg))


def test_zero_b_at_init_gives_the_base_model_bit_exactly():
  cfg = tiny_config(**LORA, lora_targets=".")  # every block kernel
  params, ids = _lora_params(cfg, nonzero_b=False)
  assert all(not np.any(b) for p, b in jax.tree_util.tree_leaves_with_path(params)
             if path_str(p).endswith(lora.LORA_B))
  base, _ = lora.split(params)
  np.testing.assert_array_equal(_apply(cfg, params, ids),
                                _apply(lora.without_adapters(cfg), base, ids))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_merged_params_give_the_adapted_model(scan_layers):
  cfg = tiny_config(**LORA, lora_targets="query|value|wo", scan_layers=scan_layers)
  params, ids = _lora_params(cfg)
  merged = lora.merge(params, cfg)
  assert not lora.has_adapters(merged)
  np.testing.assert_allclose(_apply(lora.without_adapters(cfg), merged, ids),
                             _apply(cfg, params, ids), atol=1e-5)


def test_scan_and_loop_layouts_give_the_same_outputs():
  cfg = tiny_config(**LORA)
  params, ids = _lora_params(cfg)
  scanned = cfg.replace(scan_layers=True)
  np.testing.assert_allclose(_apply(scanned, loop_to_scan(params), ids),
                             _apply(cfg, params, ids), atol=1e-6)


def test_a_train_step_changes_only_adapters_and_the_head():
  cfg = tiny_config(**LORA)
  encoder, ids = _lora_params(cfg)
  head = np.asarray(jax.random.normal(jax.random.key(5), (32, 2)))
  params = {"encoder": encoder, "head": {"kernel": head}}

  def loss_fn(p):
    pooled = Encoder(cfg).apply({"params": p["encoder"]}, ids).pooled
    return jnp.mean(jax.nn.log_softmax(pooled @ p["head"]["kernel"])[:, 0])

  optim = ml_collections.ConfigDict(dict(learning_rate=1e-2, total_steps=10))
  tx, _ = make_optimizer(optim, params, num_layers=2)
  state = tx.init(params)
  updates, state = tx.update(jax.grad(loss_fn)(params), state, params)
  after = optax.apply_updates(params, updates)
  changed = {path_str(p) for (p, a), b in zip(jax.tree_util.tree_leaves_with_path(after),
                                              jax.tree.leaves(params)) if np.any(a != b)}
  adapters = {path_str(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)
              if lora.is_adapter(p)}
  assert changed == adapters | {"head/kernel"}
  # Frozen params get no optimizer state: Adam's two moments cover adapters + head only.
  moments = sum(x.size for x in jax.tree.leaves(state) if np.ndim(x))
  assert moments == 2 * (lora.count(encoder)[0] + 64)


def test_lora_also_train_unfreezes_matching_encoder_params():
  cfg = tiny_config(**LORA)
  encoder, _ = _lora_params(cfg, nonzero_b=False)
  optim = ml_collections.ConfigDict(dict(lora_also_train=("norm",)))
  mask = trainable_mask({"encoder": encoder}, optim)
  flat = {path_str(p): m for p, m in jax.tree_util.tree_leaves_with_path(mask)}
  assert flat["encoder/layers_0/ffn_norm/scale"] and flat["encoder/layers_0/attention/query/lora_a"]
  assert not flat["encoder/layers_0/attention/query/kernel"]
  with pytest.raises(ValueError, match="'nothing_here' matches no parameter"):
    make_optimizer({"lora_also_train": ("nothing_here",)}, {"encoder": encoder}, num_layers=2)


@pytest.mark.parametrize("fields, message", [
    (dict(lora_rank=4, lora_targets="quer(y"), r"lora_targets='quer\(y' is not a regex"),
    (dict(lora_rank=4, lora_targets="qkv"), r"matches no block kernel; kernels: "
                                            r"attention/query/kernel, .*ffn/wo/kernel"),
    (dict(lora_rank=-1), "lora_rank must be an integer >= 0"),
    (dict(lora_rank=4, lora_alpha=0.0), "lora_alpha must be positive"),
    (dict(lora_rank=4, lora_dropout=1.0), r"lora_dropout must be in \[0, 1\)"),
])
def test_bad_lora_settings_are_clear_errors(fields, message):
  with pytest.raises(ValueError, match=message):
    tiny_config(**fields)


def _write_run(path, cfg, params):
  return write_encoder(RunDir(path), cfg, params)


def test_init_from_restores_the_base_and_merges_a_lora_source(tmp_path):
  base_cfg = tiny_config()
  base, _ = _lora_params(base_cfg)
  plain = _write_run(tmp_path / "plain", base_cfg, base)
  cfg = tiny_config(**LORA, scan_layers=True)  # into the other layout, with adapters
  target = lora.split(encoder_params(cfg))[0]
  restored = restore_base(plain, target)
  jax.tree.map(np.testing.assert_array_equal, restored, loop_to_scan(base))

  trained, ids = _lora_params(tiny_config(**LORA))
  source = _write_run(tmp_path / "lora", tiny_config(**LORA), trained)
  merged = restore_base(source, encoder_params(base_cfg))
  np.testing.assert_allclose(_apply(base_cfg, merged, ids),
                             _apply(tiny_config(**LORA), trained, ids), atol=1e-5)


def test_convert_merges_adapters_or_extracts_them(tmp_path):
  cfg = tiny_config(**LORA)
  params, ids = _lora_params(cfg)
  _write_run(tmp_path / "run", cfg, params)
  convert(tmp_path / "run", tmp_path / "adapters", adapters_only=True)
  adapters, stored = read_adapters(tmp_path / "adapters" / "adapters.safetensors")
  assert stored == cfg
  jax.tree.map(np.testing.assert_array_equal, adapters, lora.split(params)[1])
  convert(tmp_path / "run", tmp_path / "merged", merge_lora=True)
  merged_run = RunDir.open(tmp_path / "merged")
  merged_cfg = stored_config(merged_run)
  assert merged_cfg.lora_rank == 0
  merged = restore_encoder(merged_run, encoder_params(merged_cfg))
  np.testing.assert_allclose(_apply(merged_cfg, merged, ids),
                             _apply(cfg, params, ids), atol=1e-5)
  with pytest.raises(ValueError, match="was not trained with LoRA"):
    convert(tmp_path / "merged", tmp_path / "again", adapters_only=True)
  with pytest.raises(ValueError, match="choose one of --merge_lora"):
    convert(tmp_path / "run", tmp_path / "again", adapters_only=True, merge_lora=True)


@pytest.mark.slow
def test_a_lora_classify_run_learns_and_trains_only_adapters_and_head(tmp_path):
  vocab = th.write_vocab(tmp_path)
  base = th.tiny_config(tmp_path, th.text_corpus(tmp_path), vocab)
  base.num_train_steps = 3
  from jaxencoder.train.loop import train_and_evaluate
  train_and_evaluate(base, tmp_path / "base")
  config = th.tiny_config(tmp_path, th.classification_set(tmp_path), vocab, **LORA,
                          lora_targets=".", dropout_rate=0.0, attention_dropout_rate=0.0)
  config.task, config.data.kind, config.data.eval_split = "classify", "text_classification", "test"
  config.init_from = str(tmp_path / "base")
  config.num_train_steps, config.eval_every, config.checkpoint_every = 80, 80, 80
  config.optim.learning_rate = 3e-2
  train_and_evaluate(config, tmp_path / "cls")
  losses = th.train_losses(tmp_path / "cls")
  assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:10])
  before = th.final_params(base, tmp_path / "base")["encoder"]
  after = th.final_params(config, tmp_path / "cls")
  base_after, adapters = lora.split(after["encoder"])
  jax.tree.map(np.testing.assert_array_equal, base_after, before)
  assert any(np.any(b != 0) for p, b in jax.tree_util.tree_leaves_with_path(adapters)
             if path_str(p).endswith(lora.LORA_B))
  assert "head" in after
