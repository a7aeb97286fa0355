"""Best-fit packing (data.packing="best_fit"): whole documents, cut only when longer than a
row, packed by best fit through a bounded pool that a restored iterator rebuilds exactly."""

import json
import logging

import grain
import ml_collections
import numpy as np
import pytest

from data_helpers import WORDS, tiny_tokenizer
from jaxencoder.data import packing, pipeline, pooled_packing
from jaxencoder.data.pipeline import Reading
from jaxencoder.train import loop
from jaxencoder.train.config import base_config, finalize

SEQ = 16


def _corpus(n: int, seed: int = 0) -> list[dict]:
  """n texts: 4 in 5 of 1..8 vocab words, the rest of 15..40 (longer than SEQ tokens)."""
  rng = np.random.default_rng(seed)
  sizes = np.where(rng.random(n) < 0.8, rng.integers(1, 9, n), rng.integers(15, 41, n))
  return [{"text": " ".join(rng.choice(WORDS, size=k)).encode()} for k in sizes]


def _batches(source, mode="best_fit", *, seq_len=SEQ, batch_size=4, seed=3, num_epochs=1,
             **kw) -> list[dict]:
  ds = pipeline.mlm_pipeline(source, tiny_tokenizer(), seq_len=seq_len, batch_size=batch_size,
                             mode=mode, read=Reading(seed=seed, num_epochs=num_epochs,
                                                     shard_index=0, shard_count=1), **kw)
  return list(ds)


def _segments(batches) -> list[tuple[tuple[int, ...], ...]]:
  """(mlm_labels, input_ids, mlm_weights) of every segment of every row, checking that each
  row is laid out as a packed row must be."""
  out = []
  for b in batches:
    for r in range(len(b["input_ids"])):
      seg, pos = b["segment_ids"][r], b["positions"][r]
      np.testing.assert_array_equal(b["attention_mask"][r], seg > 0)
      assert (b["input_ids"][r][seg == 0] == tiny_tokenizer().pad_id).all()
      assert not b["token_type_ids"][r].any() and not b["mlm_weights"][r][seg == 0].any()
      n = int((seg > 0).sum())
      assert (seg[n:] == 0).all()  # padding only after the last segment
      assert (np.diff(seg[:n]) >= 0).all() and set(seg[:n]) == set(range(1, seg.max() + 1))
      for s in range(1, seg.max() + 1):
        at = seg == s
        assert (pos[at] == np.arange(at.sum())).all()  # positions restart per segment
        out.append(tuple(tuple(b[k][r][at].tolist())
                         for k in ("mlm_labels", "input_ids", "mlm_weights")))
  return out


def _pieces(source, length) -> list[tuple[int, ...]]:
  """Every text's whole encoding, cut into consecutive pieces of `length` tokens."""
  ids = [e.ids for e in tiny_tokenizer().encodings([ex["text"].decode() for ex in source])]
  return [tuple(doc[i:i + length]) for doc in ids for i in range(0, len(doc), length)]


def _fill(batches) -> float:
  real = [b["attention_mask"][b["attention_mask"].any(axis=1)] for b in batches]
  return packing.padding_efficiency(np.concatenate(real))


# ------------------------------------------------------------------ the algorithm
def test_best_fit_puts_a_sequence_in_the_row_with_least_room_left():
  # 8 -> row 0 (room 2); 6 -> row 1 (room 4); 3 -> row 1 (room 1); 1: first fit takes
  # row 0 (the first with room), best fit row 1 (the least room that fits)
  assert packing.first_fit(np.array([8, 6, 3, 1]), 10)[0].tolist() == [0, 1, 1, 0]
  row_N, offset_N, rows = packing.best_fit(np.array([8, 6, 3, 1]), 10)
  assert rows == 2 and row_N.tolist() == [0, 1, 1, 1] and offset_N.tolist() == [0, 0, 6, 9]
  with pytest.raises(ValueError, match="11 tokens does not fit length 10"):
    packing.best_fit(np.array([3, 11]), 10)


def test_a_sequence_longer_than_the_row_is_cut_into_consecutive_pieces():
  assert packing.piece_lengths(np.array([3, 8, 9, 17]), 8).tolist() == [3, 8, 8, 1, 8, 8, 1]


def test_whole_documents_reads_wider_until_no_document_fills_its_row():
  docs = [np.arange(n) + 100 * i for i, n in enumerate([3, 9, 40, 5])]
  widths = []

  def rows_of(index_M, width):  # truncates as the tokenizer does: keeps the last token
    widths.append((width, index_M.tolist()))
    rows = np.zeros((len(index_M), width), np.int32)
    lengths = np.zeros(len(index_M), np.int64)
    for m, i in enumerate(index_M):
      doc = docs[i] if len(docs[i]) <= width else np.append(docs[i][:width - 1], docs[i][-1])
      rows[m, :len(doc)], lengths[m] = doc, len(doc)
    return {"ids": rows}, lengths

  tokens, lengths = packing.whole_documents(rows_of, np.array([0, 1, 2, 3]), 5)
  assert widths == [(5, [0, 1, 2, 3]), (20, [1, 2, 3]), (80, [2])]
  np.testing.assert_array_equal(tokens["ids"], np.concatenate(docs))
  assert lengths.tolist() == [3, 9, 40, 5]


# ------------------------------------------------------------------ the pipeline
def test_every_token_appears_once_and_only_a_longer_document_is_cut():
  source = _corpus(150)
  segments = _segments(_batches(source))
  assert sorted(labels for labels, _, _ in segments) == sorted(_pieces(source, SEQ))
  assert max(len(labels) for labels, _, _ in segments) == SEQ  # long documents were cut


def test_whole_documents_are_masked_as_pack_masks_them():
  """Rows long enough that nothing is cut: each document's tokens, masked ids and
  weights are the same under best_fit as under pack (draws keyed by example index)."""
  source = _corpus(150)
  fits = sorted(_segments(_batches(source, seq_len=64)))
  assert fits == sorted(_segments(_batches(source, "pack", seq_len=64)))
  assert any(any(w) for _, _, w in fits)


def test_best_fit_fills_rows_better_than_greedy_packing():
  """A fixed corpus of short and long texts, one epoch at L=64, batches of 4: best fit
  fills 0.987 of the slots (pools of 64 rows), greedy first fit 16 texts at a time 0.837."""
  source = _corpus(600, seed=1)
  best, greedy = _fill(_batches(source, seq_len=64)), _fill(_batches(source, "pack", seq_len=64))
  assert best >= 0.98 and greedy < 0.85


def test_rows_depend_only_on_the_seed():
  source = _corpus(120)
  a, b = _batches(source, seed=5), _batches(source, seed=5)
  assert len(a) == len(b) and all(np.array_equal(x[k], y[k]) for x, y in zip(a, b) for k in x)
  assert not np.array_equal(a[0]["input_ids"], _batches(source, seed=6)[0]["input_ids"])


def test_resumed_iterator_yields_identical_rows_from_any_point_of_a_pool():
  """Pools of 3 rows' tokens, batches of 2: states mid-pool and at pool ends, through JSON
  (as checkpoints store them), resume with the same batches."""
  ds = pipeline.mlm_pipeline(_corpus(80), tiny_tokenizer(), seq_len=SEQ, batch_size=2,
                             mode="best_fit", sizes=pipeline.PackSizes(examples=5, pool_rows=3),
                             read=Reading(seed=1, num_epochs=None, shard_index=0,
                                          shard_count=1))
  it, states, seen = iter(ds), [], []
  for _ in range(14):
    states.append(json.loads(json.dumps(it.get_state())))
    seen.append(next(it))
  for k in (0, 1, 4, 7, 9):
    resumed = iter(ds)
    resumed.set_state(states[k])
    for want in seen[k:k + 5]:
      got = next(resumed)
      assert all(np.array_equal(got[key], want[key]) for key in want)


def test_a_pool_holds_at_most_its_tokens_plus_one_piece():
  """Memory: a pool takes pieces until it has pool_tokens, never the whole stream."""
  lengths = np.random.default_rng(0).integers(1, 9, 400)
  chunks = [{"tokens": {"ids": np.arange(int(c.sum()), dtype=np.int32)}, "lengths": c}
            for c in np.split(lengths, 40)]
  rows_ds = pooled_packing.BestFitRows(grain.MapDataset.source(chunks).to_iter_dataset(),
                                       length=8, pool_tokens=40)
  it, pools = iter(rows_ds), []
  for row in it:
    if it.get_state()["emitted"] == 1:
      pools.append(0)
    pools[-1] += int(row["attention_mask"].sum())
  assert sum(pools) == lengths.sum() and len(pools) > 10
  assert max(pools) <= 40 + 8 - 1 and min(pools[:-1]) >= 40


def test_a_packed_run_logs_its_efficiency_and_leaves_the_iterator_put(caplog):
  it = iter(pipeline.mlm_pipeline(_corpus(200), tiny_tokenizer(), seq_len=SEQ, batch_size=4,
                                  mode="best_fit",
                                  read=Reading(seed=0, num_epochs=None, shard_index=0,
                                               shard_count=1)))
  first = loop.peek(it)
  data = ml_collections.ConfigDict({"kind": "text_corpus", "packing": "best_fit"})
  with caplog.at_level(logging.INFO, logger="jaxencoder"):
    loop.log_packing(data, it)
  assert np.array_equal(next(it)["input_ids"], first["input_ids"])
  line = f"over {4 * loop.PACKING_BATCHES} rows (L={SEQ})"
  assert any(r.getMessage().startswith("packing: best_fit, efficiency 0.") and
             r.getMessage().endswith(line) for r in caplog.records)


def test_an_unknown_packing_mode_names_the_choices():
  config = base_config()
  config.data.packing = "bestfit"
  with pytest.raises(ValueError, match="data.packing='bestfit' is not a packing mode; choose "
                                       "one of 'pad', 'pack', 'best_fit'"):
    finalize(config)
