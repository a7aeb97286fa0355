"""EncoderConfig: presets, overrides and errors that name the field."""

import dataclasses
import pathlib
import re

import jax
import numpy as np
import pytest

from jaxencoder import Encoder, EncoderConfig
from jaxencoder.model.config import PRESETS

MODEL_PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "model.md"  # the presets table
# BERT's published parameter counts (millions, rounded), Turc et al. 2019 / Devlin et al. 2019.
PUBLISHED_M = {"tiny": 4.4, "mini": 11.3, "small": 29.1, "medium": 41.7,
               "base": 110.0, "large": 340.0}
# Exact counts with vocab_size=30522 and BERT's pooler; base is transformers' bert-base-uncased
# (BertModel: 109,482,240).
EXACT = {"tiny": 4_385_920, "mini": 11_170_560, "small": 28_763_648, "medium": 41_373_184,
         "base": 109_482_240, "large": 335_141_888}


def bert_count(num_layers: int, d: int, vocab: int = 30522, positions: int = 512,
               types: int = 2) -> int:
  """BERT's parameters in closed form: embeddings + LayerNorm, N x (Q, K, V, O with
  biases; D -> 4D -> D with biases; two LayerNorms), the dense pooler."""
  f = 4 * d
  layer = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
  return (vocab + positions + types) * d + 2 * d + num_layers * layer + d * d + d


def count_params(cfg: EncoderConfig) -> int:
  ids = jax.ShapeDtypeStruct((1, 8), np.int32)
  shapes = jax.eval_shape(lambda x: Encoder(cfg).init(jax.random.key(0), x), ids)
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes))


@pytest.mark.parametrize("name", sorted(PUBLISHED_M))
def test_preset_param_count_is_berts_exactly(name):
  num_layers, width, _ = PRESETS[name]
  cfg = EncoderConfig.preset(name, vocab_size=30522, pooler_dense=True)
  assert count_params(cfg) == EXACT[name] == bert_count(num_layers, width)
  assert EXACT[name] / 1e6 == pytest.approx(PUBLISHED_M[name], rel=0.02)  # the papers round


def test_docs_preset_table_states_the_exact_counts():
  rows = re.findall(r"^\| (\w+) \| (\d+) / (\d+) / (\d+) \| ([\d.]+)M \|", MODEL_PAGE.read_text(),
                    flags=re.MULTILINE)
  table = {name: ((int(n), int(d), int(h)), params) for name, n, d, h, params in rows}
  assert sorted(table) == sorted(EXACT)
  for name, (sizes, params) in table.items():
    assert sizes == PRESETS[name], name
    assert params == f"{EXACT[name] / 1e6:.2f}", name


def test_preset_sizes_and_overrides():
  cfg = EncoderConfig.preset("small", vocab_size=1000, dropout_rate=0.0)
  assert (cfg.num_layers, cfg.emb_dim, cfg.num_heads) == (4, 512, 8)
  assert cfg.resolved_head_dim == 64 and cfg.resolved_mlp_dim == 2048
  assert cfg.vocab_size == 1000 and cfg.dropout_rate == 0.0
  assert EncoderConfig.preset("base", num_layers=3).num_layers == 3


def test_config_is_frozen_and_hashable():
  cfg = EncoderConfig.preset("tiny")
  with pytest.raises(dataclasses.FrozenInstanceError):
    cfg.emb_dim = 3
  assert hash(cfg) == hash(EncoderConfig.preset("tiny"))
  assert EncoderConfig.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("overrides, message", [
    (dict(emb_dim=100, num_heads=3), "emb_dim=100 is not divisible by num_heads=3"),
    (dict(activation="swish"), "activation='swish'"),
    (dict(norm="batchnorm"), "norm='batchnorm'"),
    (dict(attention_impl="flash"), "attention_impl='flash'"),
    (dict(position_embedding="alibi"), "position_embedding='alibi'"),
    (dict(pooling="first"), "pooling='first'"),
    (dict(remat_policy="sometimes"), "remat_policy='sometimes'"),
    (dict(dtype="int8"), "dtype='int8'"),
    (dict(dropout_rate=1.5), "dropout_rate must be in [0, 1)"),
    (dict(mlp_dropout_rate=1.0), "mlp_dropout_rate must be in [0, 1)"),
    (dict(num_layers=0), "num_layers must be positive"),
    (dict(input_kind="image", image_size=(30, 32), patch_size=8), "not divisible by patch_size=8"),
    (dict(input_kind="series", use_cls_token=False), "pooling='cls' needs a [CLS] vector"),
    (dict(attention_impl="linear", causal=True), "'linear' does not support ['causal']"),
    (dict(position_embedding="rope", emb_dim=30, num_heads=2), "must be even for rope"),
])
def test_invalid_config_names_the_field(overrides, message):
  with pytest.raises(ValueError) as err:
    EncoderConfig.preset("tiny", **overrides)
  assert message in str(err.value)


def test_unknown_field_and_preset_are_rejected():
  with pytest.raises(ValueError, match=r"unknown field\(s\) \['hiden_size'\]"):
    EncoderConfig.preset("tiny", hiden_size=3)
  with pytest.raises(ValueError, match="unknown name 'huge'"):
    EncoderConfig.preset("huge")


def test_an_image_encoder_belongs_to_the_vit_family_by_default():
  """family's default ("bert") names the text layout; an image encoder's only layout is
  ViT's, so pretrained.save, convert and the probe report name that."""
  assert EncoderConfig(input_kind="image", image_size=(8, 8), patch_size=4).family == "vit"
  assert EncoderConfig().family == "bert"
  with pytest.raises(ValueError, match="family"):
    EncoderConfig(family="gpt2")


def test_a_run_saved_before_a_setting_existed_resumes_at_its_default():
  """A saved config lacking settings added since (task options, EncoderConfig fields)
  compares as if it had their defaults: no change, so the run resumes; a real change
  still shows."""
  from jaxencoder.io.checkpoint import to_json
  from jaxencoder.train.config import base_config, finalize
  from jaxencoder.train.resume import config_changes
  config = finalize(base_config())
  saved = to_json(config)
  for key in ("sentence_pair", "electra", "max_span_len"):
    del saved[key]
  for key in ("family", "position_offset", "embedding_dim", "norm_bias"):
    del saved["model"][key]
  assert config_changes(saved, config) == ([], [])
  saved["model"]["num_layers"] = 7
  assert config_changes(saved, config)[1] == [f"model.num_layers: 7 -> {config.model.num_layers}"]


# The data section a run saved before the data kinds owned their keys (issue 43): every
# kind's keys flat, as base_config held them.
FLAT_DATA = {
    "kind": "text_corpus", "source": "shakespeare", "data_dir": "data", "tokenizer": "",
    "seq_len": 128, "packing": "pad", "mask_rate": 0.15, "mask_rate_schedule": [],
    "whole_word": False, "views": "dropout", "min_words": 3, "max_words": 10, "sources": "",
    "eval_split": "", "holdout_every": 20, "test_split": "", "random_flip": False,
    "random_shift": 0, "random_scale": 0.0, "num_threads": -1, "workers": -1,
    "tokenize_once": True, "allow_changed_data": False}


def test_a_run_saved_with_every_kinds_data_keys_flat_resumes_unchanged():
  """The data kinds' options (jaxencoder/data/kinds/) merge into config.data under their
  old spelling: a run saved with them flat compares equal; a changed one still shows."""
  from jaxencoder.io.checkpoint import to_json
  from jaxencoder.train.config import base_config, finalize
  from jaxencoder.train.resume import config_changes
  config = finalize(base_config())
  saved = {**to_json(config), "data": dict(FLAT_DATA)}
  assert config_changes(saved, config) == ([], [])
  saved["data"]["random_flip"] = True
  assert config_changes(saved, config)[1] == ["data.random_flip: True -> False"]


@pytest.mark.parametrize("batch, accum, structural", [
    (16, 2, False), (8, 4, False), (4, 8, False), (16, 1, True), (8, 2, True)])
def test_a_resume_may_split_a_steps_rows_another_way_but_not_change_them(batch, accum,
                                                                        structural):
  """batch_size x grad_accum_steps rows a step: the same batches and updates however they
  are split (a run that ran out of memory resumes with smaller micro-batches)."""
  from jaxencoder.io.checkpoint import to_json
  from jaxencoder.train.config import base_config, finalize
  from jaxencoder.train.resume import config_changes
  saved = finalize(base_config())
  saved.batch_size, saved.optim.grad_accum_steps = 32, 1
  current = finalize(base_config())
  current.batch_size, current.optim.grad_accum_steps = batch, accum
  allowed, refused = config_changes(to_json(saved), current)
  assert (allowed, refused)[structural] and not (allowed, refused)[not structural]
