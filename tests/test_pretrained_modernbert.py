"""ModernBERT: the architecture (global / local layers, per-kind RoPE base, layer 0's
missing norm) and its Hugging Face layout. The `live` tests build a random
transformers ModernBertModel / ModernBertForMaskedLM and skip without torch."""

import json
import pathlib

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import random_ids, tiny_config
from jaxencoder import Encoder, EncoderForMaskedLM
from jaxencoder.model.stack_layout import loop_to_scan
from jaxencoder import pretrained
from jaxencoder.model import flash
from jaxencoder.pretrained import modernbert
from jaxencoder.tokenizer import Tokenizer

WINDOW = 2  # |i - j| <= 2 in local layers


def modern_config(**overrides):
  """A 4-layer ModernBERT-style encoder: layers 0 and 3 global, 1 and 2 local."""
  fields = dict(type_vocab_size=0, num_layers=4, position_embedding="rope", activation="geglu",
                norm_position="pre", norm_eps=1e-5, use_bias=False, norm_bias=False,
                first_attention_norm=False, sliding_window=WINDOW, global_attention_every=3,
                rope_base=1000.0, local_rope_base=50.0, attention_impl="xla", family="modernbert")
  fields.update(overrides)
  return tiny_config(**fields)


def init(cfg, ids, module=Encoder):
  return nn.meta.unbox(module(cfg).init(jax.random.key(1), ids)["params"])


def run(cfg, params, ids, **kwargs):
  return Encoder(cfg).apply({"params": params}, ids, **kwargs)


IDS = random_ids(0, (2, 12))


# ------------------------------------------------------------------ architecture
def test_local_layers_attend_only_within_the_window_and_global_layers_everywhere():
  cfg = modern_config()
  out = run(cfg, init(cfg, IDS), IDS, output_attentions=True)
  far_QxK = np.abs(np.arange(12)[:, None] - np.arange(12)[None, :]) > WINDOW
  for layer, probs_BxHxLxL in enumerate(out.attentions):
    beyond = np.asarray(probs_BxHxLxL)[..., far_QxK]
    if layer in (1, 2):
      assert np.all(beyond == 0), layer
    else:
      assert np.all(beyond > 0), layer


def test_a_token_beyond_the_window_changes_nothing_in_a_local_only_stack():
  local_only = modern_config(num_layers=2, global_attention_every=0, local_rope_base=None)
  mixed = modern_config(num_layers=2, global_attention_every=2)  # layer 0 global
  changed = IDS.at[:, 2 * WINDOW + 1].set((IDS[:, 2 * WINDOW + 1] + 1) % 97)
  for cfg, reaches in ((local_only, False), (mixed, True)):
    params = init(cfg, IDS)
    first = lambda ids: run(cfg, params, ids).last_hidden_state[:, 0]
    assert (float(jnp.abs(first(IDS) - first(changed)).max()) > 1e-4) == reaches


def test_local_layers_use_local_rope_base_and_global_layers_rope_base():
  cfg = modern_config()
  params = init(cfg, IDS)
  out = lambda c: np.asarray(run(c, params, IDS).last_hidden_state)
  assert not np.allclose(out(cfg), out(cfg.replace(local_rope_base=7.0)))
  chex.assert_trees_all_close(out(cfg.replace(local_rope_base=1000.0)),
                              out(cfg.replace(global_attention_every=3, local_rope_base=None)))
  one_global = cfg.replace(num_layers=1)  # layer 0 is global: the local base is unused
  params_1 = init(one_global, IDS)
  chex.assert_trees_all_equal(run(one_global, params_1, IDS).last_hidden_state,
                              run(one_global.replace(local_rope_base=7.0), params_1,
                                  IDS).last_hidden_state)


def test_layer_0_skips_its_attention_norm_but_later_layers_apply_theirs():
  cfg = modern_config()
  params = init(cfg, IDS)
  base = run(cfg, params, IDS).last_hidden_state
  for layer, changes in (("layers_0", False), ("layers_1", True)):
    edited = jax.tree.map(lambda x: x, params)
    edited[layer]["attention_norm"]["scale"] = params[layer]["attention_norm"]["scale"] * 3.0
    moved = float(jnp.abs(run(cfg, edited, IDS).last_hidden_state - base).max())
    assert (moved > 1e-4) == changes, layer


def test_norm_bias_false_drops_only_the_norm_biases():
  params = init(modern_config(use_bias=True), IDS)
  assert "bias" not in params["embeddings"]["norm"] and "bias" not in params["final_norm"]
  assert "bias" in params["layers_1"]["attention"]["query"]
  assert "bias" in init(tiny_config(), IDS)["layers_0"]["attention_norm"]


@pytest.mark.parametrize("jit", [False, True])
def test_scanned_stack_equals_looped_stack(jit):
  cfg = modern_config()
  params = init(cfg, IDS)
  scanned = cfg.replace(scan_layers=True)
  rows_BxM = jnp.array([[1, 7], [4, 11]])
  for kwargs in ({}, {"output_positions": rows_BxM}):
    looped_fn = lambda p: run(cfg, p, IDS, **kwargs).last_hidden_state
    scanned_fn = lambda p: run(scanned, p, IDS, **kwargs).last_hidden_state
    if jit:
      looped_fn, scanned_fn = jax.jit(looped_fn), jax.jit(scanned_fn)
    chex.assert_trees_all_close(scanned_fn(loop_to_scan(params)), looped_fn(params),
                                atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_splash_serves_the_pattern_looped_and_scanned(scan_layers):
  """Every layer on splash either way (scanned: by period, each slot's window static)."""
  cfg = modern_config(scan_layers=scan_layers)
  params = init(cfg.replace(scan_layers=False), IDS)
  params = loop_to_scan(params) if scan_layers else params
  mask_BxL = jnp.ones_like(IDS).at[1, 9:].set(0)
  real = lambda impl: run(cfg.replace(attention_impl=impl), params, IDS,
                          attention_mask=mask_BxL).last_hidden_state[mask_BxL.astype(bool)]
  with flash.recorded_plans() as plans:
    on_splash = real("splash")
  assert [p.impl for p in plans[-1]] == ["splash"] * cfg.num_layers
  chex.assert_trees_all_close(on_splash, real("xla"), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fields, message", [
    (dict(global_attention_every=3), "needs sliding_window"),
    (dict(sliding_window=4, global_attention_every=-1), "must be >= 0"),
    (dict(sliding_window=4, local_rope_base=10.0, position_embedding="rope"), "local_rope_base"),
    (dict(first_attention_norm=False), "norm_position='pre'"),
])
def test_config_rejects_inconsistent_layer_pattern_fields(fields, message):
  with pytest.raises(ValueError, match=message):
    tiny_config(**fields)


# ------------------------------------------------------------------ Hugging Face layout
def hf_dict(**overrides):
  fields = dict(model_type="modernbert", vocab_size=97, hidden_size=32, intermediate_size=64,
                num_hidden_layers=4, num_attention_heads=4, local_attention=4,
                global_attn_every_n_layers=3, global_rope_theta=1000.0, local_rope_theta=50.0)
  fields.update(overrides)
  return fields


def test_legacy_and_new_config_keys_give_the_same_encoder_config():
  legacy = modernbert.encoder_config(hf_dict())
  types = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
  new = modernbert.encoder_config(hf_dict(
      layer_types=types, global_attn_every_n_layers=None, global_rope_theta=None,
      local_rope_theta=None,
      rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1000.0},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}))
  assert legacy == new
  assert (legacy.global_attention_every, legacy.sliding_window) == (3, 2)
  assert (legacy.rope_base, legacy.local_rope_base) == (1000.0, 50.0)


def test_unsupported_config_options_are_named_in_one_error():
  hf = hf_dict(hidden_activation="gelu_pytorch_tanh", attention_bias=True, mlp_bias=False,
               layer_types=["sliding_attention", "full_attention"] * 2,
               rope_parameters={"full_attention": {"rope_type": "yarn", "rope_theta": 1.0}})
  with pytest.raises(ValueError) as e:
    modernbert.encoder_config(hf)
  for name in ("hidden_activation", "mlp_bias", "layer_types", "yarn"):
    assert name in str(e.value)


def saved_masked_lm(tmp_path, cfg):
  params = init(cfg, IDS, EncoderForMaskedLM)
  return modernbert.save(tmp_path / "hf", cfg, params), params


def test_load_save_load_gives_identical_params_and_files(tmp_path):
  cfg = modern_config()
  first_dir, params = saved_masked_lm(tmp_path, cfg)
  cfg_1, params_1, _ = modernbert.load(first_dir)
  unused = lambda p: p["encoder"]["layers_0"]["attention_norm"]
  params_1["encoder"]["layers_0"]["attention_norm"] = unused(params)
  chex.assert_trees_all_equal(params_1, params)  # layer 0's unused norm is not saved
  assert cfg_1.replace(initializer_range=cfg.initializer_range, max_len=cfg.max_len,
                       attention_impl="xla", mlp_dim=None) == cfg.replace(mlp_dim=None)
  second_dir = modernbert.save(tmp_path / "again", cfg_1, params_1)
  chex.assert_trees_all_equal(load_file(str(first_dir / "model.safetensors")),
                              load_file(str(second_dir / "model.safetensors")))
  hf = json.loads((first_dir / "config.json").read_text())
  assert hf["architectures"] == ["ModernBertForMaskedLM"] and "decoder.weight" not in load_file(
      str(first_dir / "model.safetensors"))


def test_tokenizer_json_round_trips_and_names_the_special_ids(tmp_path):
  cfg = modern_config()
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(92)]
  directory = modernbert.save(tmp_path, cfg, init(cfg, IDS), Tokenizer.from_vocab(vocab))
  hf = json.loads((directory / "config.json").read_text())
  assert (hf["pad_token_id"], hf["cls_token_id"], hf["sep_token_id"]) == (0, 2, 3)
  _, _, tokenizer = modernbert.load(directory)
  assert tokenizer.encode("w5 w7")["input_ids"].tolist()[:4] == [2, 10, 12, 3]


def test_loaded_scanned_layout_gives_the_looped_outputs(tmp_path):
  cfg = modern_config()
  directory, _ = saved_masked_lm(tmp_path, cfg)
  outs = []
  for scan in (False, True):
    cfg_s, params, _ = modernbert.load(directory, scan_layers=scan)
    outs.append(EncoderForMaskedLM(cfg_s.replace(attention_impl="xla")).apply(
        {"params": params}, IDS)[0])
  chex.assert_trees_all_close(*outs, atol=1e-5, rtol=1e-5)


def test_generic_load_and_save_dispatch_to_modernbert(tmp_path):
  cfg = modern_config()
  params = init(cfg, IDS)
  directory = pretrained.save(tmp_path, cfg, params)  # cfg.family = "modernbert"
  assert json.loads((directory / "config.json").read_text())["model_type"] == "modernbert"
  cfg_1, params_1, _ = pretrained.load(directory)
  assert cfg_1.family == "modernbert"
  loaded = run(cfg_1.replace(attention_impl="xla"), params_1, IDS).last_hidden_state
  chex.assert_trees_all_close(loaded, run(cfg, params, IDS).last_hidden_state, atol=1e-6)


def test_fused_tensors_are_split_and_joined_in_hf_row_order():
  tensors = {"layers.0.attn.Wqkv.weight": np.arange(12.0).reshape(6, 2),
             "layers.0.mlp.Wi.weight": np.arange(8.0).reshape(4, 2),
             "final_norm.weight": np.ones(2)}
  split = modernbert.split_fused(tensors)
  np.testing.assert_array_equal(split["layers.0.attn.Wqkv.weight#k"], tensors[
      "layers.0.attn.Wqkv.weight"][2:4])
  np.testing.assert_array_equal(split["layers.0.mlp.Wi.weight#gate"], tensors[
      "layers.0.mlp.Wi.weight"][2:])
  chex.assert_trees_all_equal(modernbert.join_fused(split), tensors)


def test_wrong_shape_tensor_is_named(tmp_path):
  directory, _ = saved_masked_lm(tmp_path, modern_config())
  hf = json.loads((directory / "config.json").read_text())
  (directory / "config.json").write_text(json.dumps({**hf, "intermediate_size": 48}))
  with pytest.raises(ValueError, match=r"layers\.0\.mlp\.Wi\.weight"):
    modernbert.load(directory)


def test_a_head_mlmhead_cannot_express_is_skipped_with_a_warning(tmp_path, caplog):
  directory, params = saved_masked_lm(tmp_path, modern_config())
  hf = json.loads((directory / "config.json").read_text())
  (directory / "config.json").write_text(json.dumps({**hf, "classifier_activation": "relu"}))
  _, loaded, _ = modernbert.load(directory)
  assert "mlm_head" not in loaded and "classifier_activation" in caplog.text
  chex.assert_trees_all_equal(loaded["final_norm"], params["encoder"]["final_norm"])


def test_save_rejects_a_config_modernbert_cannot_express(tmp_path):
  cfg = tiny_config()  # BERT: learned positions, post-norm, gelu
  with pytest.raises(ValueError, match="position_embedding.*norm_position"):
    modernbert.save(tmp_path, cfg, init(cfg, IDS))


# ------------------------------------------------------------------ live (torch)
@pytest.fixture(scope="module")
def torch_transformers():
  return pytest.importorskip("torch"), pytest.importorskip("transformers")


def hf_model(torch, transformers, masked_lm: bool):
  """A random 4-layer ModernBERT (layers 0, 3 global; 1, 2 local with |i - j| <= 3)
  whose norms are not all ones."""
  torch.manual_seed(0)
  config = transformers.ModernBertConfig(
      vocab_size=211, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
      num_attention_heads=4, local_attention=6, global_attn_every_n_layers=3,
      global_rope_theta=1000.0, local_rope_theta=50.0, pad_token_id=0, bos_token_id=1,
      eos_token_id=2, cls_token_id=1, sep_token_id=2, attn_implementation="eager")
  cls = transformers.ModernBertForMaskedLM if masked_lm else transformers.ModernBertModel
  model = cls(config).eval()
  with torch.no_grad():
    for p in model.parameters():
      p.add_(torch.randn_like(p) * 0.05)
  return model


def padded_batch(vocab: int = 211, lengths: tuple[int, ...] = (20, 13, 6)):
  """Random ids [B, L] (L = lengths[0]), row b right-padded with 0 after lengths[b]."""
  ids_BxL = np.random.RandomState(0).randint(3, vocab, (len(lengths), lengths[0]))
  mask_BxL = (np.arange(lengths[0])[None, :] < np.array(lengths)[:, None]).astype(ids_BxL.dtype)
  return ids_BxL * mask_BxL, mask_BxL


def torch_run(torch, model, ids_BxL, mask_BxL):
  with torch.no_grad():
    out = model(input_ids=torch.as_tensor(ids_BxL), attention_mask=torch.as_tensor(mask_BxL))
  return (out.logits if hasattr(out, "logits") else out.last_hidden_state).numpy()


def max_real_diff(a, b, mask_BxL):
  return float(np.abs(np.asarray(a) - np.asarray(b))[mask_BxL.astype(bool)].max())


@pytest.mark.parametrize("scan_layers", [False, True])
def test_live_model_matches_transformers_both_ways(torch_transformers, tmp_path, scan_layers):
  torch, transformers = torch_transformers
  model = hf_model(torch, transformers, masked_lm=False)
  model.save_pretrained(tmp_path / "hf")
  ids_BxL, mask_BxL = padded_batch()
  reference = torch_run(torch, model, ids_BxL, mask_BxL)
  cfg, params, _ = modernbert.load(tmp_path / "hf", scan_layers=scan_layers)
  ours = run(cfg, params, jnp.asarray(ids_BxL), attention_mask=jnp.asarray(mask_BxL))
  to_jax = max_real_diff(ours.last_hidden_state, reference, mask_BxL)
  modernbert.save(tmp_path / "ours", cfg, params)
  reloaded = transformers.ModernBertModel.from_pretrained(tmp_path / "ours",
                                                          attn_implementation="eager").eval()
  to_torch = max_real_diff(torch_run(torch, reloaded, ids_BxL, mask_BxL),
                           ours.last_hidden_state, mask_BxL)
  print(f"ModernBertModel max-abs: transformers -> jaxencoder {to_jax:.2e}, "
        f"jaxencoder -> transformers {to_torch:.2e}")
  assert to_jax < 1e-4 and to_torch < 1e-4


def test_live_masked_lm_logits_match_transformers_both_ways(torch_transformers, tmp_path):
  torch, transformers = torch_transformers
  model = hf_model(torch, transformers, masked_lm=True)
  model.save_pretrained(tmp_path / "hf")
  ids_BxL, mask_BxL = padded_batch()
  reference = torch_run(torch, model, ids_BxL, mask_BxL)
  cfg, params, _ = modernbert.load(tmp_path / "hf")
  assert set(params) == {"encoder", "mlm_head"}
  logits, _ = EncoderForMaskedLM(cfg).apply({"params": params}, jnp.asarray(ids_BxL),
                                            jnp.asarray(mask_BxL))
  to_jax = max_real_diff(logits, reference, mask_BxL)
  modernbert.save(tmp_path / "ours", cfg, params)
  reloaded = transformers.ModernBertForMaskedLM.from_pretrained(
      tmp_path / "ours", attn_implementation="eager").eval()
  to_torch = max_real_diff(torch_run(torch, reloaded, ids_BxL, mask_BxL), logits, mask_BxL)
  print(f"ModernBertForMaskedLM logits max-abs: transformers -> jaxencoder {to_jax:.2e}, "
        f"jaxencoder -> transformers {to_torch:.2e}")
  assert to_jax < 1e-4 and to_torch < 1e-4


def test_live_parity_needs_the_window_at_this_length(torch_transformers, tmp_path):
  """Without the local window (all layers global) jaxencoder would not match: the batch
  is long enough that the window hides tokens."""
  torch, transformers = torch_transformers
  model = hf_model(torch, transformers, masked_lm=False)
  model.save_pretrained(tmp_path / "hf")
  ids_BxL, mask_BxL = padded_batch()
  reference = torch_run(torch, model, ids_BxL, mask_BxL)
  cfg, params, _ = modernbert.load(tmp_path / "hf")
  all_global = run(cfg.replace(global_attention_every=1), params, jnp.asarray(ids_BxL),
                   attention_mask=jnp.asarray(mask_BxL))
  assert max_real_diff(all_global.last_hidden_state, reference, mask_BxL) > 1e-2


def test_live_a_jaxencoder_trained_model_saves_as_a_matching_transformers_model(
    torch_transformers, tmp_path):
  """From our own init (norms perturbed, layer 0's unused norm too), not a round trip."""
  torch, transformers = torch_transformers
  cfg = modern_config(vocab_size=211, emb_dim=64, num_heads=4, mlp_dim=96, sliding_window=3)
  ids_BxL, mask_BxL = padded_batch()
  params = init(cfg, jnp.asarray(ids_BxL), EncoderForMaskedLM)
  leaves, tree = jax.tree.flatten(params)
  noise = [0.1 * jax.random.normal(jax.random.key(i), x.shape) for i, x in enumerate(leaves)]
  params = jax.tree.unflatten(tree, [x + n for x, n in zip(leaves, noise)])
  logits, _ = EncoderForMaskedLM(cfg).apply({"params": params}, jnp.asarray(ids_BxL),
                                            jnp.asarray(mask_BxL))
  modernbert.save(tmp_path, cfg, params)
  model = transformers.ModernBertForMaskedLM.from_pretrained(
      tmp_path, attn_implementation="eager").eval()
  to_torch = max_real_diff(torch_run(torch, model, ids_BxL, mask_BxL), logits, mask_BxL)
  print(f"jaxencoder-initialised ModernBERT MLM -> transformers: logits max-abs {to_torch:.2e}")
  assert to_torch < 1e-4


@pytest.mark.slow
def test_live_configs_modernbert_base_cpu_run_converts_to_transformers_with_its_logits(
    torch_transformers, tmp_path):
  """configs/modernbert_base.py:cpu (scanned by period, best-fit packed, WSD, 30% masking,
  MiniLM's vocabulary) trains 4 steps from train.py's loop; `jaxencoder-convert` makes a
  ModernBertForMaskedLM whose logits are the run's own model's on a padded batch. A corpus
  made here stands in for Shakespeare (no fetch); everything else is the recipe."""
  torch, transformers = torch_transformers
  import train_helpers as th
  from jaxencoder.pretrained.__main__ import main as convert_main
  from jaxencoder.train.config_file import load_config
  from jaxencoder.train.config import apply_overrides, encoder_config
  from jaxencoder.train.loop import train_and_evaluate
  config = load_config(str(pathlib.Path(__file__).parents[1] / "configs" /
                           "modernbert_base.py") + ":cpu")
  assert config.model.scan_layers and config.data.packing == "best_fit"
  source = th.text_corpus(tmp_path, docs=600)
  apply_overrides(config, [f"data.source={source}", f"data.data_dir={tmp_path}",
                           "num_train_steps=4", "eval_every=4", "checkpoint_every=4",
                           "log_every=2", "progress_bar=false"])
  train_and_evaluate(config, tmp_path / "run")
  convert_main(["--from", str(tmp_path / "run"), "--to", str(tmp_path / "hf")])
  model = transformers.ModernBertForMaskedLM.from_pretrained(
      tmp_path / "hf", attn_implementation="eager").eval()
  cfg = encoder_config(config)
  ids_BxL, mask_BxL = padded_batch(cfg.vocab_size, lengths=(config.data.seq_len, 77, 30))
  params = nn.meta.unbox(th.final_params(config, tmp_path / "run"))
  assert "layers" in params["encoder"]  # the scanned layout
  logits = lambda c: EncoderForMaskedLM(c).apply({"params": params}, jnp.asarray(ids_BxL),
                                                 jnp.asarray(mask_BxL))[0]
  reference = torch_run(torch, model, ids_BxL, mask_BxL)
  error = max_real_diff(reference, logits(cfg), mask_BxL)
  print(f"configs/modernbert_base.py:cpu run -> transformers: logits max-abs {error:.2e}")
  assert error < 1e-4
  # The rows are long enough that the window hides tokens: all-global layers would differ.
  assert max_real_diff(reference, logits(cfg.replace(global_attention_every=1)), mask_BxL) > 1e-3


# ------------------------------------------------------------------ trained here, exported
@pytest.mark.slow
def test_configs_modernbert_tiny_trains_without_token_types_and_exports(tmp_path):
  """configs/modernbert_tiny.py's architecture (no type table: the pipeline feeds no
  token_type_ids) trains from train.py's loop, and the run converts to a ModernBERT
  directory whose weights are the run's."""
  import train_helpers as th
  from jaxencoder.pretrained.convert import convert
  from jaxencoder.train.config_file import load_config
  from jaxencoder.train.loop import train_and_evaluate
  config = load_config(str(pathlib.Path(__file__).parents[1] / "configs" / "modernbert_tiny.py"))
  tiny = th.tiny_config(tmp_path, th.text_corpus(tmp_path), th.write_vocab(tmp_path))
  config.data.source, config.data.data_dir, config.data.tokenizer = (
      tiny.data.source, tiny.data.data_dir, tiny.data.tokenizer)
  config.model.vocab_size, config.model.emb_dim, config.model.mlp_dim = len(th.VOCAB), 32, 64
  config.data.seq_len, config.batch_size, config.eval_batch_size = 32, 8, 8
  config.num_train_steps = config.eval_every = config.checkpoint_every = config.log_every = 2
  config.progress_bar = False
  assert config.model.type_vocab_size == 0 and config.model.family == "modernbert"
  train_and_evaluate(config, tmp_path / "run")
  convert(tmp_path / "run", tmp_path / "hf")
  assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "modernbert"
  cfg, params, tokenizer = pretrained.load(tmp_path / "hf")
  trained = th.final_params(config, tmp_path / "run")
  chex.assert_trees_all_close(pretrained.encoder_params(params)["layers_1"],
                              nn.meta.unbox(trained)["encoder"]["layers_1"])
  assert tokenizer is not None and cfg.global_attention_every == 3
