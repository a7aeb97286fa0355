"""RoBERTa, DistilBERT and ELECTRA checkpoints: names, offsets, round trips, parity.

Always on: family dispatch, load -> save -> load on files written with
safetensors.numpy, RoBERTa's position offset, ELECTRA's embedding projection, the
convert and probe CLIs. The `live` tests build small random transformers models
(torch) and compare last_hidden_state (and heads) both ways; they skip without torch,
and `make parity` forbids the skip. Run with -s to see the max-abs differences.
"""

import json
import pathlib

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers
from safetensors.numpy import save_file

from conftest import tiny_config
from data_helpers import VOCAB, WORDS, tiny_tokenizer
from jaxencoder import Encoder, EncoderForMaskedLM
from jaxencoder.model.config import CHECKPOINT_FAMILIES
from jaxencoder.model.electra import Electra
from jaxencoder.pretrained import encoder_params, load, save
from jaxencoder.pretrained.convert import convert
from jaxencoder.pretrained.hf_checkpoint import FAMILY_MODULES, family_module
from jaxencoder.tokenizer import Tokenizer

TOL = 1e-4
SENTENCES = ["the quick brown fox ran far away", "time flies like an arrow",
             "a cat sat on the mat, and the dog ran.", "fruit flies like a banana"]
PAIRS = [("the cat sat on a mat", "a dog ran far away"),
         ("time flies", "fruit flies like a banana")]


# ------------------------------------------------------------------ helpers
def bpe_tokenizer(directory: pathlib.Path) -> Tokenizer:
  """A byte-level BPE (RoBERTa's specials) trained on a few sentences; vocab.json +
  merges.txt written to `directory`."""
  from tokenizers import models, pre_tokenizers, trainers
  hf = tokenizers.Tokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  trainer = trainers.BpeTrainer(vocab_size=320, show_progress=False,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  hf.train_from_iterator(SENTENCES * 10 + [" ".join(p) for p in PAIRS] * 10, trainer)
  directory.mkdir(parents=True, exist_ok=True)
  hf.model.save(str(directory))
  return Tokenizer.from_file(directory / "vocab.json")


# config.json of a tiny model per family, as transformers writes it (the keys we read).
HF_CONFIGS = {
    "roberta": dict(model_type="roberta", vocab_size=97, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=64, max_position_embeddings=66,
                    type_vocab_size=1, pad_token_id=1, hidden_act="gelu", layer_norm_eps=1e-5),
    "distilbert": dict(model_type="distilbert", vocab_size=97, dim=32, n_layers=2, n_heads=4,
                       hidden_dim=64, max_position_embeddings=64, activation="gelu"),
    "electra": dict(model_type="electra", vocab_size=97, embedding_size=16, hidden_size=32,
                    num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                    max_position_embeddings=64, type_vocab_size=2, hidden_act="gelu"),
}


def write_hf_dir(directory, family, head=None, seed=0):
  """config.json + model.safetensors of random tensors under the family's HF names."""
  layout = family_module(family).LAYOUT
  hf = HF_CONFIGS[family]
  cfg = layout.encoder_config(hf, pooler_dense=layout.pooler)
  prefix = layout.prefix if head else ""
  slots = layout.encoder_slots(cfg, pooler=layout.pooler and not head, prefix=prefix)
  slots += layout.head(head).slots(cfg) if head else []
  rng = np.random.default_rng(seed)
  tensors = {s.hf_name: rng.normal(size=s.hf_shape).astype(np.float32) for s in slots}
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "config.json").write_text(json.dumps(hf))
  save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
  return tensors


def run_encoder(cfg, params, batch):
  types = batch.get("token_type_ids") if cfg.type_vocab_size else None
  out = Encoder(cfg).apply({"params": encoder_params(params)}, jnp.asarray(batch["input_ids"]),
                           jnp.asarray(batch["attention_mask"]),
                           None if types is None else jnp.asarray(types))
  return np.asarray(out.last_hidden_state), np.asarray(out.pooled)


def text_batch(tokenizer, pad_to=24):
  """Right-padded singles then pairs: ids, mask, types."""
  singles = tokenizer.encode_batch(SENTENCES, pad_to=pad_to)
  pairs = tokenizer.encode_batch(*zip(*PAIRS), pad_to=pad_to)
  return {k: np.concatenate([singles[k], pairs[k]])
          for k in ("input_ids", "attention_mask", "token_type_ids")}


# ------------------------------------------------------------------ dispatch
def test_unknown_model_type_names_it_and_the_supported_families(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
  with pytest.raises(ValueError, match=r"model_type='gpt2' is not supported; supported: "
                                       r"\['bert', 'distilbert', 'electra', 'modernbert', "
                                       r"'roberta', 'vit'\]"):
    load(tmp_path)


def test_family_is_validated():
  with pytest.raises(ValueError, match="family='gpt2' is not one of"):
    tiny_config(family="gpt2")


def test_every_family_a_config_may_name_has_a_module():
  assert sorted(FAMILY_MODULES) == sorted(CHECKPOINT_FAMILIES)


@pytest.mark.parametrize("family,head", [
    ("roberta", None), ("roberta", "mlm_head"), ("distilbert", None),
    ("distilbert", "mlm_head"), ("electra", None), ("electra", "discriminator_head"),
    ("electra", "mlm_head")])
def test_load_save_load_gives_identical_params_and_tensors(tmp_path, family, head):
  written = write_hf_dir(tmp_path / "hf", family, head)
  cfg, params, _ = load(tmp_path / "hf")
  assert cfg.family == family and (head is None or set(params) == {"encoder", head})
  save(tmp_path / "ours", cfg, params)
  cfg2, params2, _ = load(tmp_path / "ours")
  assert cfg2 == cfg
  chex.assert_trees_all_equal(params2, params)
  from safetensors.numpy import load_file
  chex.assert_trees_all_equal(load_file(str(tmp_path / "ours" / "model.safetensors")), written)


def test_scanned_load_of_a_family_round_trips(tmp_path):
  write_hf_dir(tmp_path / "hf", "distilbert", "mlm_head")
  cfg, params, _ = load(tmp_path / "hf", scan_layers=True)
  assert params["encoder"]["layers"]["ffn"]["wi"]["kernel"].shape == (2, 32, 64)
  save(tmp_path / "ours", cfg, params)
  chex.assert_trees_all_equal(load(tmp_path / "ours")[1], load(tmp_path / "hf")[1])


def test_config_reads_each_family(tmp_path):
  cfgs = {}
  for family in HF_CONFIGS:
    write_hf_dir(tmp_path / family, family)
    cfgs[family] = load(tmp_path / family)[0]
  assert (cfgs["roberta"].position_offset, cfgs["roberta"].type_vocab_size,
          cfgs["roberta"].max_len, cfgs["roberta"].norm_eps) == (2, 1, 66, 1e-5)
  assert (cfgs["distilbert"].type_vocab_size, cfgs["distilbert"].pooler_dense,
          cfgs["distilbert"].norm_eps) == (0, False, 1e-12)
  assert (cfgs["electra"].embedding_dim, cfgs["electra"].emb_dim) == (16, 32)


def test_a_bert_config_cannot_be_saved_as_distilbert(tmp_path):
  cfg = tiny_config(family="distilbert")  # type_vocab_size=2: DistilBERT has no types
  params = Encoder(cfg).init(jax.random.key(0), jnp.ones((1, 4), jnp.int32))["params"]
  with pytest.raises(ValueError, match=r"no DistilBERT equivalent: type_vocab_size=2"):
    save(tmp_path, cfg, params)


def test_electra_pretraining_params_save_the_discriminator(tmp_path):
  """jaxencoder.model.electra.Electra -> ElectraForPreTraining; its generator has no HF
  place next to the discriminator and is left out."""
  cfg = tiny_config(family="electra", embedding_dim=16)
  params = nn.meta.unbox(Electra(cfg).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))[
      "params"])
  save(tmp_path, cfg, params)
  assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
      "ElectraForPreTraining"]
  _, loaded, _ = load(tmp_path)
  assert set(loaded) == {"encoder", "discriminator_head"}
  chex.assert_trees_all_equal(loaded["discriminator_head"], params["discriminator_head"])
  chex.assert_trees_all_equal(loaded["encoder"], params["encoder"])
  # convert keeps the discriminator head both ways (HF -> run directory -> HF).
  convert(tmp_path, tmp_path.parent / "electra_run")
  convert(tmp_path.parent / "electra_run", tmp_path.parent / "electra_back")
  _, back, _ = load(tmp_path.parent / "electra_back")
  chex.assert_trees_all_equal(back, loaded)


# ------------------------------------------------------------------ offsets, projection
def test_position_offset_reads_rows_past_the_offset():
  cfg = tiny_config(position_offset=2, type_vocab_size=1)
  ids_BxL = jnp.array([[5, 6, 7, 8]])
  params = nn.meta.unbox(Encoder(cfg).init(jax.random.key(0), ids_BxL)["params"])
  table = params["embeddings"]["position_embed"]["embedding"]
  shifted = jax.tree.map(lambda x: x, params)
  shifted["embeddings"]["position_embed"]["embedding"] = jnp.roll(table, -2, axis=0)
  ours = Encoder(cfg).apply({"params": params}, ids_BxL).last_hidden_state
  plain = Encoder(cfg.replace(position_offset=0)).apply({"params": shifted}, ids_BxL)
  np.testing.assert_allclose(ours, plain.last_hidden_state, atol=1e-6)


def test_position_offset_shortens_the_longest_input():
  cfg = tiny_config(max_len=8, position_offset=2)
  params = Encoder(cfg).init(jax.random.key(0), jnp.ones((1, 6), jnp.int32))["params"]
  with pytest.raises(ValueError, match=r"sequence length 7 is longer.*position_offset=2"):
    Encoder(cfg).apply({"params": params}, jnp.ones((1, 7), jnp.int32))


@pytest.mark.slow
def test_embedding_dim_projects_narrow_tables_and_trains():
  cfg = tiny_config(embedding_dim=16)
  ids_BxL = jnp.array([[5, 6, 7, 8, 9]])
  params = nn.meta.unbox(EncoderForMaskedLM(cfg).init(jax.random.key(0), ids_BxL)["params"])
  embeddings = params["encoder"]["embeddings"]
  assert embeddings["token_embed"]["embedding"].shape == (97, 16)
  assert embeddings["project"]["kernel"].shape == (16, 32)
  assert params["mlm_head"]["transform"]["kernel"].shape == (32, 16)

  def loss(p):
    logits_BxLxV, _ = EncoderForMaskedLM(cfg).apply({"params": p}, ids_BxL)
    return -jnp.take_along_axis(jax.nn.log_softmax(logits_BxLxV), ids_BxL[..., None], -1).mean()

  grads = jax.grad(loss)(params)
  assert all(np.isfinite(g).all() for g in jax.tree.leaves(grads))
  assert np.abs(grads["encoder"]["embeddings"]["project"]["kernel"]).max() > 0


def test_embedding_dim_equal_to_emb_dim_is_refused():
  """ELECTRA has no projection when the widths agree; None says so without ambiguity."""
  with pytest.raises(ValueError, match="embedding_dim=32 must be a positive width other than"):
    tiny_config(embedding_dim=32)


# ------------------------------------------------------------------ convert and probe CLIs
def save_random(directory, family, tokenizer, **overrides):
  """A family's HF directory from random jaxencoder params (no torch)."""
  fields = {"roberta": dict(position_offset=2, type_vocab_size=1, max_len=66),
            "distilbert": dict(type_vocab_size=0), "electra": dict(embedding_dim=16)}[family]
  cfg = tiny_config(family=family, vocab_size=max(97, tokenizer.vocab_size),
                    **{**fields, **overrides})
  params = nn.meta.unbox(Encoder(cfg).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))[
      "params"])
  return save(directory, cfg, params, tokenizer)


@pytest.mark.parametrize("family", ["roberta", "distilbert", "electra"])
def test_convert_cli_round_trips_each_family(tmp_path, family):
  from jaxencoder.pretrained.__main__ import main
  tokenizer = bpe_tokenizer(tmp_path / "bpe") if family == "roberta" else tiny_tokenizer()
  save_random(tmp_path / "hf", family, tokenizer)
  main(["convert", "--from", str(tmp_path / "hf"), "--to", str(tmp_path / "run")])
  convert(tmp_path / "run", tmp_path / "back")
  cfg, params, tok = load(tmp_path / "hf")
  cfg2, params2, tok2 = load(tmp_path / "back")
  assert cfg2 == cfg and cfg2.family == family
  chex.assert_trees_all_equal(params2, params)
  assert tok2.kind == tok.kind
  np.testing.assert_array_equal(tok2.encode_batch(SENTENCES)["input_ids"],
                                tok.encode_batch(SENTENCES)["input_ids"])


@pytest.mark.parametrize("family", ["roberta", "distilbert"])
def test_probe_cli_reads_a_family_directory_and_names_it(tmp_path, family):
  from jaxencoder.probing import __main__ as probe
  tokenizer = bpe_tokenizer(tmp_path / "bpe") if family == "roberta" else tiny_tokenizer()
  save_random(tmp_path / "hf", family, tokenizer)
  rng = np.random.default_rng(0)
  lines = [" ".join(f"{w}/{'DET' if w in ('the', 'a') else 'X'}"
                    for w in rng.choice(WORDS[:20], size=5)) for _ in range(30)]
  (tmp_path / "tags.txt").write_text("\n".join(lines) + "\n")
  report = probe.main(["--pretrained", str(tmp_path / "hf"), "--data", str(tmp_path / "tags.txt"),
                       "--out", str(tmp_path / "out"), "--max-epochs", "2", "--no-control"])
  kind = "byte_level_bpe" if family == "roberta" else "wordpiece"
  assert report["model"]["family"] == family
  assert report["tokenizer"] == {"kind": kind, "word_alignment": "first sub-word"}
  assert report["data"]["items"] == 150
  assert json.loads((tmp_path / "out" / "report.json").read_text())["model"]["family"] == family


# ------------------------------------------------------------------ live (torch)
@pytest.fixture(scope="module")
def torch_transformers():
  return pytest.importorskip("torch"), pytest.importorskip("transformers")


def torch_hidden(torch, model, batch, types: bool):
  keys = ("input_ids", "attention_mask") + (("token_type_ids",) if types else ())
  with torch.no_grad():
    out = model(**{k: torch.as_tensor(np.asarray(batch[k], np.int64)) for k in keys})
  return out.last_hidden_state.numpy()


def real_token_error(ours_BxLxD, theirs_BxLxD, mask_BxL) -> float:
  """Max-abs difference over real tokens. Padding rows are excluded: they never reach
  a real token (masked keys), and RoBERTa numbers them differently (padding_idx
  instead of offset + i), so their values are not comparable."""
  return float(np.abs(ours_BxLxD - theirs_BxLxD)[mask_BxL == 1].max())


def check_both_ways(torch, model_cls, hf_dir, out_dir, batch, family, types):
  """HF -> ours, then ours (saved) -> HF; returns the two max-abs errors."""
  cfg, params, _ = load(hf_dir)
  ours = run_encoder(cfg, params, batch)[0]
  errors = []
  for direction, directory in (("hf->jax", hf_dir), ("jax->hf", out_dir)):
    if direction == "jax->hf":
      save(out_dir, cfg, params)
    model = model_cls.from_pretrained(str(directory)).eval()
    error = real_token_error(ours, torch_hidden(torch, model, batch, types),
                             batch["attention_mask"])
    print(f"\nparity {family} {direction} last_hidden_state max-abs {error:.2e}")
    errors.append(error)
  return errors


def test_live_roberta_tokenizer_matches_transformers(torch_transformers, tmp_path):
  _, transformers = torch_transformers
  ours = bpe_tokenizer(tmp_path / "bpe")
  theirs = transformers.RobertaTokenizer.from_pretrained(str(tmp_path / "bpe"))
  for text in SENTENCES:
    np.testing.assert_array_equal(ours.encode(text)["input_ids"], theirs(text)["input_ids"])
  for a, b in PAIRS:
    np.testing.assert_array_equal(ours.encode(a, b)["input_ids"], theirs(a, b)["input_ids"])
  assert (ours.pad_id, ours.cls_id, ours.sep_id, ours.mask_id, ours.unk_id) == (
      theirs.pad_token_id, theirs.cls_token_id, theirs.sep_token_id, theirs.mask_token_id,
      theirs.unk_token_id)
  # Pre-split words encode as the joined text; each word's first sub-word starts it.
  words = SENTENCES[2].split()
  enc = ours.encode(words, is_pretokenized=True)
  np.testing.assert_array_equal(enc["input_ids"], theirs(" ".join(words))["input_ids"])
  pieces = [ours.hf.id_to_token(int(enc["input_ids"][i])) for i in enc["first_subword_index"]]
  assert pieces[0][0] != "Ġ" and all(p[0] == "Ġ" for p in pieces[1:])
  # Saved files load in transformers with the same ids.
  ours.save(tmp_path / "saved")
  again = transformers.RobertaTokenizer.from_pretrained(str(tmp_path / "saved"))
  assert again(SENTENCES[0])["input_ids"] == theirs(SENTENCES[0])["input_ids"]


def test_live_roberta_matches_pytorch_both_ways(torch_transformers, tmp_path):
  torch, transformers = torch_transformers
  torch.manual_seed(0)
  tokenizer = bpe_tokenizer(tmp_path / "bpe")
  hf_cfg = transformers.RobertaConfig(
      vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=64, max_position_embeddings=40, type_vocab_size=1, pad_token_id=1,
      layer_norm_eps=1e-5)
  transformers.RobertaModel(hf_cfg).eval().save_pretrained(tmp_path / "hf")
  batch = text_batch(tokenizer)
  assert (batch["attention_mask"] == 0).any() and batch["input_ids"][0, 0] == 0
  errors = check_both_ways(torch, transformers.RobertaModel, tmp_path / "hf", tmp_path / "ours",
                           batch, "roberta", types=False)
  assert max(errors) < TOL


def test_live_distilbert_matches_pytorch_both_ways(torch_transformers, tmp_path):
  torch, transformers = torch_transformers
  torch.manual_seed(0)
  hf_cfg = transformers.DistilBertConfig(vocab_size=len(VOCAB), dim=32, n_layers=2, n_heads=4,
                                         hidden_dim=64, max_position_embeddings=64)
  transformers.DistilBertModel(hf_cfg).eval().save_pretrained(tmp_path / "hf")
  errors = check_both_ways(torch, transformers.DistilBertModel, tmp_path / "hf",
                           tmp_path / "ours", text_batch(tiny_tokenizer()), "distilbert",
                           types=False)
  assert max(errors) < TOL


def test_live_electra_matches_pytorch_both_ways(torch_transformers, tmp_path):
  torch, transformers = torch_transformers
  torch.manual_seed(0)
  hf_cfg = transformers.ElectraConfig(
      vocab_size=len(VOCAB), embedding_size=16, hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
  transformers.ElectraModel(hf_cfg).eval().save_pretrained(tmp_path / "hf")
  batch = text_batch(tiny_tokenizer())
  assert set(np.unique(batch["token_type_ids"])) == {0, 1}  # pairs use both types
  errors = check_both_ways(torch, transformers.ElectraModel, tmp_path / "hf", tmp_path / "ours",
                           batch, "electra", types=True)
  assert max(errors) < TOL


def masked_lm_logits(cfg, params, batch, types: bool):
  types = batch["token_type_ids"] if types else None
  logits, _ = EncoderForMaskedLM(cfg).apply({"params": params}, batch["input_ids"],
                                            batch["attention_mask"], types)
  return np.asarray(logits)


@pytest.mark.parametrize("family", ["roberta", "distilbert", "electra"])
def test_live_masked_lm_heads_match_pytorch_both_ways(torch_transformers, tmp_path, family):
  torch, transformers = torch_transformers
  torch.manual_seed(0)
  small = dict(vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=64, initializer_range=0.2)
  model_cls, hf_cfg = {
      "roberta": (transformers.RobertaForMaskedLM,
                  transformers.RobertaConfig(**small, type_vocab_size=1, pad_token_id=0)),
      "distilbert": (transformers.DistilBertForMaskedLM, transformers.DistilBertConfig(
          vocab_size=len(VOCAB), dim=32, n_layers=2, n_heads=4, hidden_dim=64,
          initializer_range=0.2)),
      "electra": (transformers.ElectraForMaskedLM,
                  transformers.ElectraConfig(**small, embedding_size=16)),
  }[family]
  model_cls(hf_cfg).eval().save_pretrained(tmp_path / "hf")
  cfg, params, _ = load(tmp_path / "hf")
  assert set(params) == {"encoder", "mlm_head"}
  batch = text_batch(tiny_tokenizer())
  types = family == "electra"
  ours_BxLxV = masked_lm_logits(cfg, params, batch, types)
  save(tmp_path / "ours", cfg, params)
  for direction, directory in (("hf->jax", "hf"), ("jax->hf", "ours")):
    model = model_cls.from_pretrained(str(tmp_path / directory)).eval()
    keys = ("input_ids", "attention_mask") + (("token_type_ids",) if types else ())
    with torch.no_grad():
      theirs = model(**{k: torch.as_tensor(batch[k].astype(np.int64)) for k in keys}).logits
    error = real_token_error(ours_BxLxV, theirs.numpy(), batch["attention_mask"])
    print(f"\nparity {family} masked-LM {direction} logits max-abs {error:.2e} "
          f"(logits up to {np.abs(theirs.numpy()).max():.2f})")
    assert error < TOL


def test_live_electra_discriminator_head_matches_pytorch_both_ways(torch_transformers, tmp_path):
  torch, transformers = torch_transformers
  torch.manual_seed(0)
  hf_cfg = transformers.ElectraConfig(
      vocab_size=len(VOCAB), embedding_size=16, hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
      initializer_range=0.2)  # larger weights: logits far from 0
  transformers.ElectraForPreTraining(hf_cfg).eval().save_pretrained(tmp_path / "hf")
  cfg, params, _ = load(tmp_path / "hf")
  assert set(params) == {"encoder", "discriminator_head"}
  batch = text_batch(tiny_tokenizer())
  ours_BxL = np.asarray(Electra(cfg).apply(
      {"params": params}, batch["input_ids"], batch["attention_mask"], batch["token_type_ids"],
      method=Electra.discriminate))
  save(tmp_path / "ours", cfg, params)
  for direction, directory in (("hf->jax", "hf"), ("jax->hf", "ours")):
    model = transformers.ElectraForPreTraining.from_pretrained(str(tmp_path / directory)).eval()
    with torch.no_grad():
      theirs = model(**{k: torch.as_tensor(v.astype(np.int64)) for k, v in batch.items()}).logits
    error = float(np.abs(ours_BxL - theirs.numpy())[batch["attention_mask"] == 1].max())
    print(f"\nparity electra discriminator {direction} logits max-abs {error:.2e} "
          f"(logits up to {np.abs(theirs.numpy()).max():.2f})")
    assert error < TOL
