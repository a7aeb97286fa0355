"""Sentence-pair objectives (NSP, SOP): pairs from consecutive segments, their rows, the
loss, and a short run that learns the order."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train_helpers as th
from conftest import random_ids, tiny_config
from data_helpers import WORDS, tiny_tokenizer
from jaxencoder.data import builders, pairs
from jaxencoder.data.pipeline import Reading
from jaxencoder.data.mlm import MaskSpec
from jaxencoder.data.readers import DataError
from jaxencoder.tasks import registry
from jaxencoder.train.config import encoder_config, finalize, resolved_task
from jaxencoder.train.loop import train_and_evaluate
from jaxencoder.train.datasets import make_pipelines
from jaxencoder.tasks.registry import task_from_config


def corpus(files: int = 3, per_file: int = 8) -> list[dict]:
  """Segments "f<i> s<j>" of `files` files, listed out of order (as a prepared corpus)."""
  docs = [{"text": f"file{f} segment{s}".encode(), "origin": f"/c/play{f}.txt:{10 * s + 1}".encode()}
          for f in range(files) for s in range(per_file)]
  return [docs[i] for i in np.random.default_rng(0).permutation(len(docs))]


def segment(text) -> tuple[int, int]:
  file, seg = text.decode().split()
  return int(file[4:]), int(seg[7:])


def test_corpus_order_is_reading_order_by_file_and_line_number():
  source = corpus()
  order, files = pairs.corpus_order(source)
  read = [segment(source[i]["text"]) for i in order]
  assert read == [(f, s) for f in range(3) for s in range(8)]  # line 71 after line 11
  np.testing.assert_array_equal(files, np.repeat(np.arange(3), 8))


def test_the_parts_of_a_long_document_stay_its_consecutive_segments_of_one_file():
  # read_documents cuts a document longer than MAX_DOCUMENT_CHARS into `file:line part k`.
  origins = ["/c/a.txt:1 part 1", "/c/a.txt:1 part 2", "/c/a.txt:1 part 10", "/c/a.txt:9",
             "/c/b.txt:3 part 1", "/c/b.txt:3 part 2"]
  shuffled = np.random.default_rng(1).permutation(len(origins))
  source = [{"text": b"x", "origin": origins[i].encode()} for i in shuffled]
  order, files = pairs.corpus_order(source)
  assert [origins[shuffled[i]] for i in order] == origins
  np.testing.assert_array_equal(files, [0, 0, 0, 0, 1, 1])


@pytest.mark.parametrize("objective", pairs.OBJECTIVES)
def test_pairs_are_consecutive_segments_or_what_the_label_says(objective):
  maker = pairs.PairMaker(corpus(), objective)
  assert len(maker) == 3 * 7  # no pair across two files
  rng = np.random.default_rng(0)
  labels = []
  for k in range(len(maker)):
    for _ in range(10):
      ex = maker(k, rng)
      (fa, sa), (fb, sb) = segment(ex["text"]), segment(ex["text_b"])
      label = int(ex["pair_labels"])
      labels.append(label)
      if label == 0:  # the true next segment, in order
        assert (fb, sb) == (fa, sa + 1)
      elif objective == "sop":  # the same two, swapped
        assert (fb, sb) == (fa, sa - 1)
      else:  # a segment of another file
        assert fb != fa
  assert 0.4 < np.mean(labels) < 0.6


def test_nsp_on_a_single_file_draws_outside_the_pair():
  maker = pairs.PairMaker(corpus(files=1, per_file=5), "nsp")
  rng = np.random.default_rng(1)
  for k in range(len(maker)):
    for _ in range(20):
      ex = maker(k, rng)
      if ex["pair_labels"]:
        a, b = segment(ex["text"])[1], segment(ex["text_b"])[1]
        assert b not in (a, a + 1)


def test_a_corpus_of_lone_segments_has_nothing_to_pair():
  with pytest.raises(DataError, match="nothing to pair"):
    pairs.PairMaker(corpus(files=4, per_file=1), "sop")


def test_pair_rows_are_cls_a_sep_b_sep_with_token_types_and_masks():
  tok = tiny_tokenizer()
  spec = MaskSpec(tok.vocab_size, tok.mask_id, tuple(int(i) for i in tok.special_ids), rate=0.3)
  source = [{"text": " ".join(WORDS[i:i + 3]).encode(), "origin": f"f.txt:{i}".encode()}
            for i in range(10)]
  ds = pairs.pair_pipeline(source, tok, "sop", seq_len=16, batch_size=4, mask=spec,
                           read=Reading(seed=0))
  batches = list(ds)
  assert [len(b["pair_labels"]) for b in batches] == [4, 4, 4]  # 9 pairs, last batch filled
  np.testing.assert_array_equal(batches[-1]["example_weights"], [1, 0, 0, 0])
  b = batches[0]
  cls, sep = tok.cls_id, tok.sep_id
  for row in range(4):
    ids, types, real = b["mlm_labels"][row], b["token_type_ids"][row], b["attention_mask"][row]
    n = int(real.sum())
    assert ids[0] == cls and ids[n - 1] == sep and np.sum(ids[:n] == sep) == 2
    first_sep = int(np.argmax(ids == sep))
    np.testing.assert_array_equal(types[:n], (np.arange(n) > first_sep).astype(int))
    assert not np.any(b["mlm_weights"][row][ids[:16] == sep])  # specials never masked
    words_a = tok.decode(ids[1:first_sep]).split()
    words_b = tok.decode(ids[first_sep + 1:n - 1]).split()
    first, second = (words_a, words_b) if b["pair_labels"][row] == 0 else (words_b, words_a)
    assert WORDS.index(second[0]) == WORDS.index(first[0]) + 1  # consecutive, or swapped


def test_whole_word_ids_stay_apart_across_the_pair():
  word_ids = np.array([-1, 0, 0, 1, -1, 0, 1, 1, -1])
  types = np.array([0, 0, 0, 0, 0, 1, 1, 1, 1])
  np.testing.assert_array_equal(pairs.pair_word_ids(word_ids, types),
                                [-1, 0, 0, 1, -1, 2, 3, 3, -1])


@pytest.mark.slow
def test_pair_loss_is_mlm_plus_pair_cross_entropy():
  cfg = tiny_config(pooler_dense=True)
  ids = random_ids(0, (4, 10), low=5)
  weights = jnp.zeros((4, 10)).at[:, 3].set(1.0).at[:, 6].set(1.0)
  batch = {"input_ids": ids, "attention_mask": jnp.ones_like(ids),
           "token_type_ids": jnp.broadcast_to(jnp.arange(10) >= 5, ids.shape).astype(jnp.int32),
           "mlm_labels": ids, "mlm_weights": weights, "pair_labels": jnp.array([0, 1, 1, 0]),
           "example_weights": jnp.array([1.0, 1.0, 1.0, 0.0])}
  task = registry.make_task("mlm_sop", cfg, max_predictions=4)
  params = nn.meta.unbox(task.model.init(jax.random.key(0), *task.example_batch(batch))["params"])
  assert set(params) == {"encoder", "mlm_head", "pair_head"}
  loss, sums = jax.jit(lambda p: task.loss_fn(p, batch, jax.random.key(0), False))(params)
  m = task.summarize(jax.device_get(sums))
  np.testing.assert_allclose(float(loss), m["mlm_loss"] + m["pair_loss"], rtol=1e-6)
  _, pair_logits, _ = task.model.apply({"params": params}, *task.example_batch(batch))
  ce = -jax.nn.log_softmax(pair_logits)[jnp.arange(4), batch["pair_labels"]]
  np.testing.assert_allclose(m["pair_loss"], float(jnp.sum(ce[:3]) / 3), rtol=1e-5)
  mlm = registry.make_task("mlm", cfg, max_predictions=4)
  mlm_loss, _ = mlm.loss_fn({k: params[k] for k in ("encoder", "mlm_head")}, batch,
                            jax.random.key(0), False)
  np.testing.assert_allclose(m["mlm_loss"], float(mlm_loss), rtol=1e-6)


def ordered_corpus(root, files: int = 16) -> str:
  """Files of four segments of 1, 3, 5 and 7 random words: in reading order the second
  segment of a pair is the longer one, which a few steps can learn."""
  src = root / "growing"
  src.mkdir()
  rng = np.random.default_rng(0)
  for f in range(files):
    segments = [" ".join(rng.choice(WORDS, n)) for n in (1, 3, 5, 7)]
    (src / f"c{f}.txt").write_text("\n\n".join(segments) + "\n")
  return str(builders.prepare("text_corpus", src, root / "tfds", name="growing"))


def pair_config(root, task="mlm_sop", **fields):
  config = th.tiny_config(root, ordered_corpus(root), th.write_vocab(root), pooler_dense=True,
                          dropout_rate=0.0, attention_dropout_rate=0.0)
  config.task, config.data.seq_len, config.batch_size = task, 16, 16
  config.data.holdout_every = 2  # eval pairs: consecutive held-out segments of a file
  for key, value in fields.items():
    setattr(config, key, value)
  return config


@pytest.mark.parametrize("mode", ["pack", "best_fit"])
def test_packing_sentence_pairs_is_refused(tmp_path, mode):
  config = pair_config(tmp_path)
  config.data.packing = mode
  with pytest.raises(ValueError, match=f"one sentence pair per row.*packing='{mode}'"):
    make_pipelines(finalize(config))


@pytest.mark.slow
def test_sentence_pair_is_an_option_of_mlm_and_keeps_max_predictions(tmp_path):
  """task mlm + sentence_pair nsp: pair batches, and the task predicts at most
  max_predictions masked tokens per row (the rest counted as dropped)."""
  config = finalize(pair_config(tmp_path, task="mlm", sentence_pair="nsp", max_predictions=1))
  assert resolved_task(config) == "mlm_nsp"
  batch = next(iter(make_pipelines(config).train))
  assert batch["pair_labels"].shape == (16,) and set(np.unique(batch["pair_labels"])) == {0, 1}
  task = task_from_config(config, encoder_config(config), num_classes=2)
  params = nn.meta.unbox(task.model.init(jax.random.key(0), *task.example_batch(batch))["params"])
  _, sums = task.loss_fn(params, batch, jax.random.key(0), False)
  masked_B = batch["mlm_weights"].sum(1)
  assert float(sums["dropped"]) == np.maximum(masked_B - 1, 0).sum() > 0
  assert float(sums["loss_weight"]) == np.minimum(masked_B, 1).sum()


def test_sentence_pair_on_another_task_is_an_error(tmp_path):
  config = pair_config(tmp_path, task="classify", sentence_pair="sop")
  with pytest.raises(ValueError, match="sentence_pair='sop' is an option of task 'mlm'"):
    finalize(config)
  config.task, config.sentence_pair = "mlm", "next"
  with pytest.raises(ValueError, match="sentence_pair must be one of"):
    finalize(config)


@pytest.mark.slow
def test_sop_training_learns_the_order(tmp_path):
  config = pair_config(tmp_path, num_train_steps=60, log_every=10, eval_every=60,
                       checkpoint_every=60)
  config.optim.learning_rate = 1e-2
  metrics = train_and_evaluate(config, tmp_path / "run")
  assert metrics["pair_accuracy"] > 0.9
  assert metrics["pair_loss"] < 0.3
