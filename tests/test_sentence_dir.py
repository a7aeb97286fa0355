"""Runs out as sentence-transformers directories (`jaxencoder-convert --from RUN --to DIR`,
export/sentence_dir.py): the files, their contents, and what they compute, read back by
embed and by a numpy spelling of sentence-transformers' modules (torch-free; the live
check against SentenceTransformer is tests/test_pretrained_sentence_dir.py, make parity)."""

import json
import pathlib

import numpy as np
import pytest
import tokenizers
from safetensors.numpy import load_file

import jaxencoder
from conftest import tiny_config
from data_helpers import VOCAB
from jaxencoder import Encoder, pretrained
from jaxencoder.export.sentence_dir import convert, sentence_config
from jaxencoder.model.heads import EncoderClassifier
from jaxencoder.pretrained.__main__ import main as convert_cli
from jaxencoder.pretrained.sentences import SentenceConfig, sentence_transformers_config
from jaxencoder.tasks import contrastive
from jaxencoder.train import predict
from jaxencoder.train.config import apply_overrides
from jaxencoder.train.config_file import load_config
from jaxencoder.train.loop import train_and_evaluate
from test_configs import REPO, TINY, data_overrides
from test_load import init, write_run

SEQ_LEN = 16  # data_overrides' data.seq_len; the model has 32 positions (TINY)
SHORT = ["the cat sat", "dog"]
LONG = [" ".join(["the quick brown fox jumps over the lazy dog"] * 4),  # 36 words
        "time flies like an arrow , fruit flies like a banana " * 3]
TEXTS = SHORT + LONG


def train_contrastive(root: pathlib.Path, *overrides: str) -> pathlib.Path:
  """configs/contrastive.py trained 1 step, tiny (tests/test_configs.py's overrides): RUN."""
  config = load_config(str(REPO / "configs" / "contrastive.py"))
  apply_overrides(config, TINY + data_overrides(config, root) + ["data.test_split=",
                                                                 *overrides])
  train_and_evaluate(config, root / "run")
  return root / "run"


@pytest.fixture(scope="module")
def contrastive_run(tmp_path_factory):
  """A 1-step contrastive run and its sentence-transformers directory: (RUN, DIR, summary)."""
  root = tmp_path_factory.mktemp("st")
  run = train_contrastive(root)
  return run, root / "st", convert(run, root / "st")


def sentence_transformers_in_numpy(model_dir, texts) -> np.ndarray:
  """What sentence-transformers does with a directory's files, module by module of
  modules.json: tokenise (lower-cased if asked, truncated at max_seq_length), token states
  (the Transformer's weights, run by our Encoder), Pooling, Dense, Normalize."""
  model_dir = pathlib.Path(model_dir)
  x = None
  for module in json.loads((model_dir / "modules.json").read_text()):
    kind, folder = module["type"].rsplit(".", 1)[-1], model_dir / module["path"]
    if kind == "Transformer":
      sbert = json.loads((folder / "sentence_bert_config.json").read_text())
      tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
      tok.enable_truncation(sbert["max_seq_length"])
      tok.enable_padding()
      enc = tok.encode_batch([t.lower() if sbert["do_lower_case"] else t for t in texts])
      ids_BxL, mask_BxL = (np.array([getattr(e, k) for e in enc]) for k in ("ids",
                                                                             "attention_mask"))
      cfg, params, _ = pretrained.load(folder)
      x = np.asarray(Encoder(cfg).apply({"params": pretrained.encoder_params(params)}, ids_BxL,
                                        mask_BxL).last_hidden_state)
    elif kind == "Pooling":
      modes = json.loads((folder / "config.json").read_text())
      m_BxLx1 = mask_BxL[..., None]
      if modes["pooling_mode_cls_token"]:
        x = x[:, 0]
      elif modes["pooling_mode_mean_tokens"]:
        x = (x * m_BxLx1).sum(1) / m_BxLx1.sum(1)
      else:
        x = np.where(m_BxLx1 > 0, x, -np.inf).max(1)
    elif kind == "Dense":
      dense = json.loads((folder / "config.json").read_text())
      w = load_file(str(folder / "model.safetensors"))
      x = x @ w["linear.weight"].T + w["linear.bias"]
      x = np.tanh(x) if dense["activation_function"].endswith("Tanh") else x
    elif kind == "Normalize":
      x = x / np.linalg.norm(x, axis=-1, keepdims=True)
  return x


def min_cosine(a_NxD, b_NxD) -> float:
  a_NxD = a_NxD / np.linalg.norm(a_NxD, axis=-1, keepdims=True)
  b_NxD = b_NxD / np.linalg.norm(b_NxD, axis=-1, keepdims=True)
  return float(np.sum(a_NxD * b_NxD, -1).min())


def test_an_embedding_run_converts_to_a_sentence_transformers_directory(contrastive_run):
  run, out, summary = contrastive_run
  assert summary == (f"wrote sentence-transformers directory {out} (BERT; mean pooling, "
                     f"{SEQ_LEN} tokens, normalised, cosine)")
  read = lambda name: json.loads((out / name).read_text())
  assert read("modules.json") == [
      {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
      {"idx": 2, "name": "2", "path": "2_Normalize",
       "type": "sentence_transformers.models.Normalize"}]
  # the tokenizer lower-cases; the run saved no pooler: transformers must not add one
  assert read("sentence_bert_config.json") == {"max_seq_length": SEQ_LEN, "do_lower_case": True,
                                               "model_args": {"add_pooling_layer": False}}
  assert read("1_Pooling/config.json") == {
      "word_embedding_dimension": 32, "pooling_mode_cls_token": False,
      "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False}
  assert read("config_sentence_transformers.json") == {
      "model_type": "SentenceTransformer", "similarity_fn_name": "cosine", "prompts": {},
      "default_prompt_name": None}
  assert read("2_Normalize/config.json") == {}
  assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
  assert sentence_transformers_config(out) == SentenceConfig(
      max_seq_length=SEQ_LEN, do_lower_case=True, pooling="mean", normalize=True)


def test_read_back_the_directory_embeds_as_the_run_on_short_and_long_texts(contrastive_run):
  run, out, _ = contrastive_run
  model = jaxencoder.load(run)
  assert (model.tokenizer.encode_batch(LONG)["attention_mask"].sum(-1) > SEQ_LEN).all()
  np.testing.assert_allclose(jaxencoder.load(out).embed(TEXTS), model.embed(TEXTS), atol=1e-6)


def test_what_sentence_transformers_computes_from_the_files_is_the_runs_embedding(
    contrastive_run):
  """The old directory (no modules.json: 512 tokens, no Normalize) differed on long texts."""
  run, out, _ = contrastive_run
  theirs_NxD = sentence_transformers_in_numpy(out, TEXTS)
  np.testing.assert_allclose(theirs_NxD, jaxencoder.load(run).embed(TEXTS), atol=1e-5)
  assert min_cosine(theirs_NxD, predict.predict(predict.load(run), TEXTS)) > 0.9999
  untruncated = np.asarray(jaxencoder.load(run).embed(LONG, max_length=32))
  assert min_cosine(untruncated, theirs_NxD[len(SHORT):]) < 0.9999  # the length matters


def test_matryoshka_sizes_are_written_only_when_the_pooled_vectors_were_trained(tmp_path):
  config = {"task": "contrastive", "projection_dim": 0, "matryoshka_dims": [32, 8],
            "matryoshka_weights": []}
  assert contrastive.FAMILY.embedding("contrastive", config).nested_dims == (32, 8)
  assert contrastive.FAMILY.embedding(  # the sizes are the training-only head's
      "contrastive", {**config, "projection_dim": 16}).nested_dims == ()
  assert contrastive.FAMILY.embedding(  # a baseline training the full size only
      "contrastive", {**config, "matryoshka_weights": [1.0, 0.0]}).nested_dims == ()
  cfg = tiny_config(vocab_size=len(VOCAB), pooling="mean", max_len=32)
  run = write_run(tmp_path / "run", cfg, {1: {"encoder": init(Encoder(cfg), 0)}}, **config)
  assert sentence_config(run) == SentenceConfig(max_seq_length=SEQ_LEN, do_lower_case=True,
                                                pooling="mean", matryoshka_dims=(32, 8))
  out = tmp_path / "st"
  convert(run, out)
  assert json.loads((out / "config_sentence_transformers.json").read_text())[
      "matryoshka_dims"] == [32, 8]
  assert sentence_transformers_config(out).matryoshka_dims == (32, 8)


@pytest.fixture(scope="module")
def pooler_run(tmp_path_factory):
  """A run without a task whose encoder ends in BERT's pooler (cls, dense + tanh)."""
  cfg = tiny_config(vocab_size=len(VOCAB), pooling="cls", pooler_dense=True, max_len=32)
  return write_run(tmp_path_factory.mktemp("pooler") / "run", cfg,
                   {1: {"encoder": init(Encoder(cfg), 4)}})


def test_a_run_with_berts_pooler_writes_it_as_a_dense_module(pooler_run, tmp_path):
  assert sentence_config(pooler_run) is None  # no embedding task: a Hugging Face directory
  out = tmp_path / "st"
  convert(pooler_run, out, sentence_transformers=True)
  modules = json.loads((out / "modules.json").read_text())
  assert [(m["path"], m["type"].rsplit(".", 1)[1]) for m in modules] == [
      ("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Dense", "Dense"),
      ("3_Normalize", "Normalize")]
  assert json.loads((out / "2_Dense" / "config.json").read_text()) == {
      "in_features": 32, "out_features": 32, "bias": True,
      "activation_function": "torch.nn.modules.activation.Tanh"}
  assert "model_args" not in json.loads((out / "sentence_bert_config.json").read_text())
  ours_NxD = jaxencoder.load(pooler_run).embed(TEXTS)
  np.testing.assert_allclose(sentence_transformers_in_numpy(out, TEXTS), ours_NxD, atol=1e-5)
  np.testing.assert_allclose(jaxencoder.load(out).embed(TEXTS), ours_NxD, atol=1e-6)


def test_a_directory_without_a_dense_module_never_applies_berts_pooler(pooler_run, tmp_path):
  """sentence-transformers pools the token states; the Transformer's own pooler output is
  unused even where its weights are saved (e.g. a cls-pooled BERT)."""
  out = tmp_path / "st"
  convert(pooler_run, out, sentence_transformers=True)
  modules = json.loads((out / "modules.json").read_text())
  (out / "modules.json").write_text(json.dumps([m for m in modules if "Dense" not in m["type"]]))
  cls_NxD = sentence_transformers_in_numpy(out, TEXTS)
  np.testing.assert_allclose(jaxencoder.load(out).embed(TEXTS), cls_NxD, atol=1e-6)
  assert min_cosine(cls_NxD, jaxencoder.load(pooler_run).embed(TEXTS)) < 0.99


def test_a_run_whose_task_trains_no_embeddings_stays_a_hugging_face_directory(tmp_path):
  cfg = tiny_config(vocab_size=len(VOCAB), pooling="mean", max_len=32)
  run = write_run(tmp_path / "run", cfg, {1: init(EncoderClassifier(cfg, 2), 0)},
                  labels=["no", "yes"], task="classify", num_classes=2)
  assert convert(run, tmp_path / "hf") == f"wrote Hugging Face BERT directory {tmp_path / 'hf'}"
  assert not (tmp_path / "hf" / "modules.json").exists()
  convert_cli(["--from", str(run), "--to", str(tmp_path / "st"), "--sentence-transformers"])
  assert sentence_transformers_config(tmp_path / "st") == SentenceConfig(
      max_seq_length=SEQ_LEN, do_lower_case=True, pooling="mean", normalize=True)


def test_what_cannot_be_a_sentence_transformers_directory_is_one_line(pooler_run, tmp_path):
  hf = tmp_path / "hf"
  convert(pooler_run, hf)
  with pytest.raises(ValueError, match="--sentence-transformers: .* is a Hugging Face "
                                       "directory"):
    convert(hf, tmp_path / "x", sentence_transformers=True)
  cfg = tiny_config(vocab_size=len(VOCAB), pooling="attention", max_len=32)
  run = write_run(tmp_path / "att", cfg, {1: {"encoder": init(Encoder(cfg), 0)}})
  with pytest.raises(ValueError, match="pooling='attention'"):  # no such Pooling mode
    convert(run, tmp_path / "y", sentence_transformers=True)
  assert not (tmp_path / "y").exists()  # a failed conversion leaves nothing
