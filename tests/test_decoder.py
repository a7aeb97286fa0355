"""The decoder and the encoder-decoder: causality, padding, cached decoding, gradients, and
the seq2seq task end to end (configs/seq2seq.py, init_from into other heads, probing)."""

import json
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train_helpers as th
from conftest import random_ids, tiny_config
from data_helpers import WORDS
from jaxencoder import EncoderDecoder, greedy_decode
from jaxencoder.model.decoder import Decoder, decoder_config
from jaxencoder.model.encoder import ENCODER
from jaxencoder.tasks import registry
from jaxencoder.train import predict
from jaxencoder.train.config_file import load_config
from jaxencoder.train.config import apply_overrides
from jaxencoder.train.loop import train_and_evaluate
from jaxencoder.train.metrics import read_metrics

REPO = pathlib.Path(__file__).resolve().parents[1]
# Larger initial weights than BERT's 0.02, so that every input visibly moves the outputs.
VARIANTS = {
    "loop": dict(initializer_range=0.3),
    "scan_prenorm_rope": dict(initializer_range=0.3, scan_layers=True, norm_position="pre",
                              position_embedding="rope", remat_policy="full"),
    "relative_window": dict(initializer_range=0.3, position_embedding="relative",
                            sliding_window=3),
}
B, L, T = 3, 9, 7  # batch, encoder length, decoder length


def inputs(seed: int = 0):
  """Encoder ids [B, L] with right padding, its mask, decoder ids [B, T]."""
  ids_BxL = random_ids(seed, (B, L))
  mask_BxL = (jnp.arange(L)[None, :] < jnp.array([[L], [6], [3]])).astype(jnp.int32)
  return ids_BxL, mask_BxL, random_ids(seed + 1, (B, T))


@pytest.fixture(scope="module", params=list(VARIANTS))
def built(request):
  """(model, params, jitted apply) of a tiny EncoderDecoder in one of VARIANTS."""
  return init(tiny_config(**VARIANTS[request.param]))


def init(cfg):
  ids_BxL, mask_BxL, dec_BxT = inputs()
  model = EncoderDecoder(cfg)
  params = jax.jit(model.init)(jax.random.key(0), ids_BxL, mask_BxL, None, None, None,
                               dec_BxT)["params"]
  return model, nn.meta.unbox(params), jax.jit(model.apply)


def test_decoder_position_t_never_sees_later_targets(built):
  model, params, apply = built
  ids_BxL, mask_BxL, dec_BxT = inputs()
  t = 3
  changed_BxT = dec_BxT.at[:, t + 1:].set((dec_BxT[:, t + 1:] + 5) % 97)
  before = apply({"params": params}, ids_BxL, mask_BxL, decoder_input_ids=dec_BxT)
  after = apply({"params": params}, ids_BxL, mask_BxL, decoder_input_ids=changed_BxT)
  np.testing.assert_allclose(after[:, :t + 1], before[:, :t + 1], atol=1e-5)
  assert np.abs(after[:, t + 1:] - before[:, t + 1:]).max() > 1e-2  # the change is seen later


def test_encoder_padding_does_not_change_decoder_outputs(built):
  model, params, apply = built
  ids_BxL, mask_BxL, dec_BxT = inputs()
  garbage_BxL = jnp.where(mask_BxL > 0, ids_BxL, random_ids(7, (B, L)))
  longer_BxL = jnp.concatenate([garbage_BxL, random_ids(8, (B, 4))], axis=1)
  longer_mask_BxL = jnp.pad(mask_BxL, ((0, 0), (0, 4)))
  ref = apply({"params": params}, ids_BxL, mask_BxL, decoder_input_ids=dec_BxT)
  out = apply({"params": params}, longer_BxL, longer_mask_BxL, decoder_input_ids=dec_BxT)
  np.testing.assert_allclose(out, ref, atol=1e-5)
  other = apply({"params": params}, random_ids(9, (B, L)), mask_BxL, decoder_input_ids=dec_BxT)
  assert np.abs(other - ref).max() > 1e-2  # the encoder's real tokens do matter


def full_recomputation_greedy(apply, params, ids_BxL, mask_BxL, bos, steps):
  """Greedy decoding without a cache: the whole prefix through the model at every step
  (in a fixed [B, steps] buffer, so one compile; what follows the prefix is not seen,
  as test_decoder_position_t_never_sees_later_targets checks)."""
  prefix_BxT = jnp.zeros((ids_BxL.shape[0], steps), jnp.int32).at[:, 0].set(bos)
  tokens = []
  for t in range(steps):
    logits_BxTxV = apply({"params": params}, ids_BxL, mask_BxL, decoder_input_ids=prefix_BxT)
    tokens.append(jnp.argmax(logits_BxTxV[:, t], axis=-1).astype(jnp.int32))
    if t + 1 < steps:
      prefix_BxT = prefix_BxT.at[:, t + 1].set(tokens[-1])
  return jnp.stack(tokens, axis=1)


def test_cached_greedy_decoding_equals_full_recomputation(built):
  model, params, apply = built
  ids_BxL, mask_BxL, _ = inputs()
  cached_BxT = greedy_decode(model, params, ids_BxL, mask_BxL, T, bos_id=2)
  full_BxT = full_recomputation_greedy(apply, params, ids_BxL, mask_BxL, 2, T)
  np.testing.assert_array_equal(cached_BxT, full_BxT)
  assert len({tuple(row) for row in np.asarray(full_BxT)}) > 1  # rows decode differently


def test_greedy_decoding_stops_each_row_at_its_end_token(built):
  model, params, apply = built
  ids_BxL, mask_BxL, _ = inputs()
  free_BxT = np.asarray(greedy_decode(model, params, ids_BxL, mask_BxL, T, bos_id=2))
  eos = int(free_BxT[0, 2])  # make row 0's third token the end token
  ended_BxT = np.asarray(greedy_decode(model, params, ids_BxL, mask_BxL, T, bos_id=2,
                                       eos_id=eos))
  for free_T, ended_T in zip(free_BxT, ended_BxT):
    stop = next((i for i, tok in enumerate(free_T) if tok == eos), T - 1)
    np.testing.assert_array_equal(ended_T[:stop + 1], free_T[:stop + 1])
    assert (ended_T[stop + 1:] == 0).all()


def test_gradients_of_the_decoder_loss_reach_every_encoder_layer():
  cfg = tiny_config(**VARIANTS["loop"])
  task = registry.make_task("seq2seq", cfg)
  ids_BxL, mask_BxL, dec_BxT = inputs()
  batch = {"input_ids": ids_BxL, "attention_mask": mask_BxL, "decoder_input_ids": dec_BxT,
           "decoder_mask": jnp.ones_like(dec_BxT), "target_ids": jnp.roll(dec_BxT, -1, 1),
           "target_weights": jnp.ones(dec_BxT.shape, jnp.float32)}
  params = jax.jit(task.model.init)(jax.random.key(0), *task.example_batch(batch))["params"]
  grads = jax.jit(jax.grad(lambda p: task.loss_fn(p, batch, jax.random.key(1), True)[0]))(
      nn.meta.unbox(params))
  norms = {jax.tree_util.keystr(path): float(jnp.linalg.norm(g))
           for path, g in jax.tree_util.tree_leaves_with_path(grads[ENCODER])}
  assert norms and all(n > 0 for n in norms.values()), [k for k, n in norms.items() if n == 0]


def test_the_decoder_refuses_a_bidirectional_config():
  memory_BxSxD = jnp.zeros((1, 4, 32))
  with pytest.raises(ValueError, match="causal text config"):
    Decoder(tiny_config()).init(jax.random.key(0), random_ids(0, (1, 3)), memory_BxSxD)
  cfg = decoder_config(tiny_config(input_kind="series", type_vocab_size=2))
  assert cfg.causal and cfg.input_kind == "text" and cfg.type_vocab_size == 0


# ------------------------------------------------------------------ the seq2seq task end to end
TINY_OVERRIDES = ["model.num_layers=1", "model.emb_dim=32", "model.num_heads=2",
                  "model.mlp_dim=64", "model.max_len=32", "data.seq_len=12",
                  "data.max_words=6", "data.holdout_every=5", "batch_size=8",
                  "eval_batch_size=8", "log_every=1", "eval_every=3", "checkpoint_every=3",
                  "progress_bar=false"]


def seq2seq_config(root, source, vocab, steps: int, *extra: str):
  """configs/seq2seq.py shrunk to a 1-layer, 32-wide model on the test's corpus."""
  config = load_config(str(REPO / "configs" / "seq2seq.py"))
  apply_overrides(config, TINY_OVERRIDES + [
      f"model.vocab_size={len(th.VOCAB)}", f"data.source={source}", f"data.data_dir={root}",
      f"data.tokenizer={vocab}", f"num_train_steps={steps}", *extra])
  return config


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  root = tmp_path_factory.mktemp("data")
  return root, th.text_corpus(root, docs=60), th.write_vocab(root)


@pytest.fixture(scope="module")
def seq2seq_run(corpus, tmp_path_factory):
  """A 3-step run of configs/seq2seq.py (shrunk) on the tiny corpus: (workdir, metrics)."""
  workdir = tmp_path_factory.mktemp("seq2seq")
  return workdir, train_and_evaluate(seq2seq_config(*corpus, 3), workdir)


@pytest.mark.slow
def test_seq2seq_config_trains_and_evaluates_greedy_decodes(seq2seq_run):
  workdir, metrics = seq2seq_run
  assert {"loss", "accuracy", "exact_match", "greedy_accuracy"} <= set(metrics)
  assert 0.0 <= metrics["exact_match"] <= 1.0 and 0.0 <= metrics["greedy_accuracy"] <= 1.0
  evals = [r for r in read_metrics(workdir) if r["split"] == "eval"]
  assert [r["step"] for r in evals] == [3] and np.isfinite(evals[0]["loss"])


@pytest.mark.slow
def test_seq2seq_checkpoint_encoder_loads_into_a_classifier(corpus, seq2seq_run, tmp_path):
  root, source, vocab = corpus
  workdir, _ = seq2seq_run
  trained = th.final_params(seq2seq_config(root, source, vocab, 3), workdir)
  assert set(trained) == {"encoder", "decoder"}
  cls = th.tiny_config(root, source, vocab)
  cls.task, cls.data.kind = "classify", "text_classification"
  cls.data.source, cls.data.eval_split = th.classification_set(tmp_path), "test"
  cls.init_from, cls.optim.freeze_encoder, cls.num_train_steps = str(workdir), True, 2
  train_and_evaluate(cls, tmp_path / "cls")
  after = th.final_params(cls, tmp_path / "cls")
  jax.tree.map(np.testing.assert_array_equal, after["encoder"], trained["encoder"])


@pytest.mark.slow
def test_seq2seq_checkpoint_encoder_loads_into_the_probe_cli(seq2seq_run, tmp_path):
  from jaxencoder.probing import __main__ as probe
  from jaxencoder.probing.load import load_checkpoint
  workdir, _ = seq2seq_run
  cfg, params, _ = load_checkpoint(str(workdir))
  assert cfg.num_layers == 1 and not cfg.causal and "layers_0" in params
  rng = np.random.default_rng(0)
  lines = [" ".join(f"{w}/{'DET' if w in ('the', 'a') else 'X'}"
                    for w in rng.choice(WORDS, size=6)) for _ in range(60)]
  (tmp_path / "tags.txt").write_text("\n".join(lines) + "\n")
  probe.main(["--checkpoint", str(workdir), "--data", str(tmp_path / "tags.txt"),
              "--out", str(tmp_path / "out"), "--max-epochs", "2"])
  report = json.loads((tmp_path / "out" / "report.json").read_text())
  assert len(report["probes"]["linear"]["layers"]) == cfg.num_layers + 1


@pytest.mark.slow
def test_seq2seq_learns_to_restore_memorised_sentences(tmp_path):
  """Three sentences, shuffled afresh each epoch: greedy decoding must restore them."""
  source = th.text_corpus(tmp_path, docs=90, distinct=3, name="three")
  vocab = th.write_vocab(tmp_path)
  config = seq2seq_config(tmp_path, source, vocab, 60, "eval_every=60", "checkpoint_every=60",
                          "log_every=20", "optim.learning_rate=0.01", "optim.warmup_steps=5",
                          "data.max_words=12", "data.seq_len=16")
  metrics = train_and_evaluate(config, tmp_path / "run")
  losses = [r["loss"] for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
  assert losses[-1] < 0.3 * losses[0]
  assert metrics["exact_match"] >= 0.9, metrics
  # jaxencoder-predict decodes greedily from the run: shuffled words in, the sentence out.
  sentences = sorted({t.strip() for t in (tmp_path / "three" / "a.txt").read_text().split("\n\n")})
  rng = np.random.default_rng(1)
  shuffled = [" ".join(rng.permutation(s.split())) for s in sentences]
  outputs = predict.predict(predict.load(tmp_path / "run"), shuffled)
  assert [o.split("\t")[1] for o in outputs] == shuffled
  assert sum(o.split("\t")[0] == s for o, s in zip(outputs, sentences)) >= 2, outputs
