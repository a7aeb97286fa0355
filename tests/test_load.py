"""jaxencoder.load: any checkpoint by name or path, with encode / embed / predict / apply."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

import jaxencoder
from conftest import tiny_config
from data_helpers import VOCAB, tiny_tokenizer
from gcs_emulator import gcs  # noqa: F401 (fixture)
from jaxencoder import Encoder, pretrained
from jaxencoder.io import run_record
from jaxencoder.io.checkpoint import Checkpointer
from jaxencoder.io.paths import copy_tree
from jaxencoder.model.heads import EncoderClassifier
from jaxencoder.pretrained.named_checkpoints import NAMED_CHECKPOINTS

TEXTS = ["the cat sat", "a dog ran far away from the red house", "cat"]


def init(model, seed: int):
  return nn.meta.unbox(jax.jit(model.init)(jax.random.key(seed), np.ones((1, 8), np.int32))
                       ["params"])


@pytest.fixture(scope="module")
def cfg():
  return tiny_config(vocab_size=len(VOCAB), pooling="mean")


@pytest.fixture(scope="module")
def hf_dir(cfg, tmp_path_factory):
  """A Hugging Face BERT directory of a tiny random encoder (pretrained.save)."""
  path = tmp_path_factory.mktemp("hf") / "bert"
  pretrained.save(path, cfg, init(Encoder(cfg), 0), tiny_tokenizer())
  return path


def write_run(path, cfg, steps: dict, labels=None, **config):
  """A train.py-style run directory: {step: params}, its own tokenizer copy and record."""
  with Checkpointer(path / "checkpoints", save_interval_steps=1, max_to_keep=None) as ckpt:
    for step, params in steps.items():
      ckpt.save(step, {"params": params}, force=True,
                config={"model": cfg.to_dict(), "data": {"seq_len": 16}, **config})
    ckpt.wait()
  files = run_record.save_tokenizer(path, tiny_tokenizer())
  run_record.write(path, {"tokenizer": {"files": files}, "labels": labels, "data": {},
                          "changes": []})
  return path


@pytest.fixture(scope="module")
def encoder_run(cfg, tmp_path_factory):
  """A run of two steps (1, 2) of Encoder params, without a task: (path, {step: params})."""
  steps = {1: init(Encoder(cfg), 1), 2: init(Encoder(cfg), 2)}
  path = write_run(tmp_path_factory.mktemp("run") / "run", cfg,
                   {step: {"encoder": params} for step, params in steps.items()})
  return path, steps


@pytest.fixture(scope="module")
def classifier_run(cfg, tmp_path_factory):
  params = init(EncoderClassifier(cfg, 2), 3)
  path = write_run(tmp_path_factory.mktemp("cls") / "run", cfg, {4: params},
                   labels=["no", "yes"], task="classify", num_classes=2)
  return path, params


def assert_same(a, b):
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(a), jax.device_get(b))


def test_a_registered_name_embeds_as_pretrained_embed(minilm):
  model = jaxencoder.load("minilm")
  assert model.cfg.num_layers == 6 and model.source.name == "minilm"
  np.testing.assert_allclose(model.embed(TEXTS),
                             pretrained.embed(TEXTS, minilm, progress=False), atol=1e-6)


def test_encode_gives_token_states_and_every_layers_states_and_attentions(minilm):
  model = jaxencoder.load("minilm")
  out = model.encode(TEXTS, hidden_states=True, attentions=True, batch_size=2)
  n, length = out.input_ids.shape
  assert n == 3 and out.last_hidden_state.shape == (3, length, 384)
  assert len(out.hidden_states) == 7 and len(out.attentions) == 6
  assert out.attentions[0].shape == (3, 12, length, length)
  np.testing.assert_allclose(out.hidden_states[-1], out.last_hidden_state, atol=1e-6)
  whole = model.apply(out.input_ids, out.attention_mask, out.input_ids * 0)
  np.testing.assert_allclose(out.last_hidden_state, whole.last_hidden_state, atol=1e-4)


def test_a_hugging_face_dir_loads_its_params_and_embeds_as_pretrained_embed(hf_dir, cfg):
  model = jaxencoder.load(hf_dir)
  assert model.source.kind == "hf" and model.cfg.pooling == "mean"
  assert_same(model.params, pretrained.load(hf_dir)[1])
  np.testing.assert_allclose(model.embed(TEXTS),
                             pretrained.embed(TEXTS, hf_dir, progress=False), atol=1e-6)
  assert model.encode(TEXTS).hidden_states is None


def test_a_run_dir_loads_its_newest_step_and_run_at_step_an_older_one(encoder_run):
  path, steps = encoder_run
  assert_same(jaxencoder.load(path).params, steps[2])
  older = jaxencoder.load(f"{path}@1")
  assert older.source.step == 1 and older.where.endswith("run@1")
  assert_same(older.params, steps[1])
  vectors = older.embed(TEXTS)
  np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
  with pytest.raises(ValueError, match="without a task"):
    older.predict(TEXTS)


def test_predict_on_a_classifier_run_names_its_labels(classifier_run, cfg):
  path, params = classifier_run
  model = jaxencoder.load(path)
  labels = model.predict(TEXTS)
  assert len(labels) == 3 and set(labels) <= {"no", "yes"}
  batch = model.tokenizer.encode_batch(TEXTS, max_length=16)
  logits = EncoderClassifier(cfg, 2).apply({"params": params}, batch["input_ids"],
                                           batch["attention_mask"], batch["token_type_ids"])
  assert labels == [["no", "yes"][i] for i in np.argmax(logits, -1)]
  assert model.predictions(TEXTS, scores=True).score_names == ["no", "yes"]
  assert_same(model.params, params["encoder"])


def test_an_unknown_name_is_one_line_listing_the_registered_ones():
  with pytest.raises(ValueError) as error:
    jaxencoder.load("minlm")
  message = str(error.value)
  assert message.startswith("unknown checkpoint name 'minlm'; did you mean minilm?")
  assert f"registered: {', '.join(NAMED_CHECKPOINTS)}" in message and "\n" not in message


@pytest.mark.parametrize("make,why", [
    (lambda tmp: tmp / "nowhere" / "run", "no such file or directory"),
    (lambda tmp: tmp, "neither a Hugging Face directory (config.json) nor a run directory"),
])
def test_a_bad_path_is_one_line_saying_what_load_takes(tmp_path, make, why):
  with pytest.raises(FileNotFoundError) as error:
    jaxencoder.load(make(tmp_path))
  message = str(error.value)
  assert why in message and "jaxencoder.load takes a registered name" in message
  assert "\n" not in message


def test_pretrained_load_reads_a_name_and_refuses_a_run_naming_jaxencoder_load(
    minilm, encoder_run):
  assert pretrained.load("minilm")[0] == pretrained.load(minilm)[0]
  path, _ = encoder_run
  with pytest.raises(ValueError, match=r"a run directory; pretrained.load reads Hugging Face "
                     r"directories, jaxencoder.load\(.*\) reads both"):
    pretrained.load(path)


def test_an_image_encoder_refuses_text_in_one_line(tmp_path):
  cfg = tiny_config(input_kind="image", image_size=(8, 8), patch_size=4, num_channels=1)
  params = nn.meta.unbox(jax.jit(Encoder(cfg).init)(
      jax.random.key(0), np.zeros((1, 8, 8, 1), np.float32))["params"])
  path = write_run(tmp_path / "img", cfg, {1: {"encoder": params}})
  model = jaxencoder.load(path)
  assert model.tokenizer is None
  with pytest.raises(ValueError, match=r"an image encoder; \.embed reads text"):
    model.embed(TEXTS)
  pixels = np.ones((2, 8, 8, 1), np.float32)
  assert model.apply(pixels).last_hidden_state.shape[0] == 2


def test_a_hugging_face_dir_on_gcs_loads_as_its_local_copy(gcs, hf_dir):
  copy_tree(hf_dir, gcs.url("load/bert"))
  assert_same(jaxencoder.load(gcs.url("load/bert")).params, jaxencoder.load(hf_dir).params)


def test_a_run_on_gcs_loads_at_a_step(gcs, encoder_run):
  path, steps = encoder_run
  copy_tree(path, gcs.url("load/run"))
  assert_same(jaxencoder.load(gcs.url("load/run") + "@1").params, steps[1])


def test_the_loaded_model_prints_in_one_short_line(classifier_run):
  text = repr(jaxencoder.load(classifier_run[0]))
  assert text.endswith("2 layers x 32, text, task classify)") and "\n" not in text


# The readers that resolve names and paths through pretrained/resolver.py.

def test_predict_probe_export_and_convert_read_run_at_step(encoder_run, classifier_run,
                                                           tmp_path):
  from jaxencoder.export import writer
  from jaxencoder.pretrained.convert import convert
  from jaxencoder.probing.load import load_checkpoint
  from jaxencoder.train import predict
  path, steps = encoder_run
  assert_same(load_checkpoint(f"{path}@1")[1], steps[1])
  assert writer.read_model(f"{path}@1", None)[0].source["step"] == 1
  convert(f"{path}@1", tmp_path / "hf")
  assert_same(pretrained.load(tmp_path / "hf")[1], steps[1])
  cls_path, params = classifier_run
  assert predict.load(f"{cls_path}@4").label_names == ["no", "yes"]
  with pytest.raises(FileNotFoundError, match="no step 3"):
    predict.load(f"{cls_path}@3")


def test_the_probe_and_export_take_a_registered_name(minilm):
  from jaxencoder.export import writer
  from jaxencoder.probing.load import load_pretrained
  cfg, _, tokenizer = load_pretrained("minilm")
  assert cfg == pretrained.load(minilm)[0] and tokenizer is not None
  servable, tokenizer_file = writer.read_model(None, "minilm")
  assert servable.cfg.emb_dim == 384 and tokenizer_file.startswith(str(minilm))


def test_init_from_refuses_run_at_step_in_one_line(encoder_run, tmp_path):
  from jaxencoder.train.init_from import pretrained_run_dir
  path, _ = encoder_run
  assert pretrained_run_dir(str(path), tmp_path) == str(path)
  with pytest.raises(ValueError, match=r"starts from a run's newest step; to start from "
                     r"another: jaxencoder-convert --from RUN@STEP --to DIR"):
    pretrained_run_dir(f"{path}@1", tmp_path)


def test_predict_refuses_a_hugging_face_dir_naming_jaxencoder_load(hf_dir):
  from jaxencoder.train import predict
  with pytest.raises(predict.UnsupportedRun, match=r"a Hugging Face encoder, not a run "
                     r"trained with a task; predict needs a task run \(jaxencoder.load"):
    predict.load(hf_dir)


def test_init_from_a_registered_name_converts_its_directory_once(minilm, tmp_path):
  from jaxencoder.train.init_from import CONVERTED_FROM, pretrained_run_dir
  run = pretrained_run_dir("minilm", tmp_path)
  assert run == str(tmp_path / "pretrained" / "minilm")
  stamp = json.loads((tmp_path / "pretrained" / "minilm" / CONVERTED_FROM).read_text())
  assert stamp["source"] == str(minilm)
  assert_same(jaxencoder.load(run).params, jaxencoder.load("minilm").params)
