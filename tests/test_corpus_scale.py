"""Corpora of any size: token ids in shards read by byte range (local and gs://), a prepare
stopped half-way never read as complete, tfds's sort spilling to plain files, tokenising
in processes, held-out views by arithmetic, mixtures of sources, and flat memory."""

import json
import logging
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from data_helpers import VOCAB, WORDS, assert_batches_equal, built_once, tiny_tokenizer
from gcs_emulator import gcs  # noqa: F401 (fixture)
from jaxencoder.data import builders, byte_ranges, pipeline, sources, token_ids
from jaxencoder.data.mixture import Mixture, parse_weights
from jaxencoder.data.pipeline import Reading
from jaxencoder.data.readers import DataError
from jaxencoder.io.paths import copy_tree

TESTS = pathlib.Path(__file__).resolve().parent
REPO = TESTS.parent
ONE = dict(shard_index=0, shard_count=1)  # one process's reading


def _write_corpus(root: pathlib.Path, name: str = "corpus", n: int = 120,
                  seed: int = 0) -> pathlib.Path:
  """A text_corpus source of `n` paragraphs of 1..30 vocab words, in two files."""
  rng = np.random.default_rng(seed)
  src = root / name
  src.mkdir(parents=True)
  paragraphs = [" ".join(rng.choice(WORDS, size=rng.integers(1, 31))) for _ in range(n)]
  (src / "a.txt").write_text("\n\n".join(paragraphs[: n // 2]) + "\n")
  (src / "b.txt").write_text("\n\n".join(paragraphs[n // 2:]) + "\n")
  return src


def _vocab_file(root: pathlib.Path) -> str:
  path = root / "vocab.txt"
  if not path.exists():
    path.write_text("\n".join(VOCAB) + "\n")
  return str(path)


def _prepare(root: pathlib.Path, name: str = "c", n: int = 120, seed: int = 0,
             tokenizer: str | None = "tiny"):
  """A prepared text_corpus (with the tiny vocab's stored ids unless tokenizer=None)."""
  vocab = _vocab_file(root) if tokenizer == "tiny" else tokenizer
  return builders.prepare("text_corpus", _write_corpus(root, f"{name}-src", n, seed),
                          root / "tfds", name=name, tokenizer=vocab)


def _texts(source) -> list[str]:
  return [ex["text"].decode() for ex in pipeline.read_examples(source, range(len(source)))]


def _assert_rows_equal(got, want):
  for g, w, name in zip(got, want, ("input_ids", "word_ids", "lengths"), strict=True):
    np.testing.assert_array_equal(g, w, err_msg=name)


def _take(ds, n):
  it = iter(ds)
  return [next(it) for _ in range(n)]


# ------------------------------------------------------------------ sharded stored ids
@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
  """A 120-example corpus prepared with shards of about 40 tokens: many shards."""
  root = tmp_path_factory.mktemp("sharded")
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(token_ids, "SHARD_TOKENS", 40)
    out = _prepare(root)
  return out, sources.open_source(str(out))


def test_shards_hold_whole_examples_and_add_up_to_the_split(sharded):
  out, source = sharded
  tok = tiny_tokenizer()
  encodings = tok.encodings(_texts(source))
  manifest = token_ids.read_manifest(out)
  entry = manifest["splits"]["train"]
  assert manifest["tokenizer"]["sha256"] == token_ids.tokenizer_digest(tok)
  assert entry["examples"] == len(source) == 120
  assert entry["tokens"] == sum(len(e.ids) for e in encodings)
  shards = entry["shards"]
  assert len(shards) > 10
  files = [s["name"].rsplit("-", 1)[0] for s in shards]  # a file's shards: train-FFFFF-SSSSS
  assert files == sorted(files) and set(files) == {"train-00000", "train-00001"}
  assert [s["name"] for s in shards] == [f"{f}-{files[:k].count(f):05d}"
                                         for k, f in enumerate(files)]
  assert sum(s["examples"] for s in shards) == entry["examples"]
  assert sum(s["tokens"] for s in shards) == entry["tokens"]
  tokens, lengths = [], []
  for k, shard in enumerate(shards):
    offsets = np.fromfile(out / "token_ids" / f"{shard['name']}.offsets.bin", "<i8")
    pairs = np.fromfile(out / "token_ids" / f"{shard['name']}.tokens.bin", "<i4").reshape(-1, 2)
    assert len(offsets) == shard["examples"] + 1 and offsets[0] == 0
    assert offsets[-1] == len(pairs) == shard["tokens"]
    if k < len(shards) - 1 and files[k + 1] == files[k]:  # closed at 40 tokens, not before
      assert offsets[-2] < 40 <= offsets[-1], (k, offsets)
    tokens.append(pairs)
    lengths.append(np.diff(offsets))
  want = np.concatenate([np.stack([e.ids, [-1 if w is None else w for w in e.word_ids]], 1)
                         for e in encodings])
  np.testing.assert_array_equal(np.concatenate(tokens), want)  # record order, none cut
  np.testing.assert_array_equal(np.concatenate(lengths), [len(e.ids) for e in encodings])


@pytest.mark.parametrize("seq_len", [6, 16, 40])
def test_sharded_rows_equal_tokenising_in_any_order(sharded, seq_len):
  _, source = sharded
  tok = tiny_tokenizer()
  stored, records = token_ids.stored(source, tok)
  assert records is None
  in_order = np.arange(len(source))
  shuffled = np.random.default_rng(seq_len).permutation(len(source))
  repeated = np.array([119, 0, 119, 57, 0, 1])
  for index in (in_order, shuffled, repeated):
    want = token_ids.encode_rows(pipeline.read_examples(source, index.tolist()), tok, seq_len)
    _assert_rows_equal(stored.rows(index, seq_len, tok.pad_id), want)


def test_an_index_past_the_split_is_an_index_error(sharded):
  _, source = sharded
  stored, _ = token_ids.stored(source, tiny_tokenizer())
  with pytest.raises(IndexError, match="example 120 of 120"):
    stored.rows([3, 120], 16, 0)


@pytest.mark.parametrize("mode", ["pad", "pack", "best_fit"])
def test_sharded_ids_give_the_mlm_batches_of_tokenising(sharded, mode):
  _, source = sharded
  def batches(use_stored_ids):
    return list(pipeline.mlm_pipeline(source, tiny_tokenizer(), seq_len=16, batch_size=8,
                                      mode=mode,
                                      text=pipeline.TextInput(stored_ids=use_stored_ids),
                                      read=Reading(seed=1, **ONE)))
  stored = batches(True)
  assert len(stored) >= (len(source) // 8 if mode == "pad" else 3)
  assert_batches_equal(stored, batches(False))


# ------------------------------------------------------------------ incomplete ids
def test_ids_without_their_manifest_are_refused_as_incomplete(tmp_path):
  out = _prepare(tmp_path)
  (out / "token_ids" / "manifest.json").unlink()
  source = sources.open_source(str(out))
  with pytest.raises(DataError, match=r"token ids are incomplete .*manifest\.json is missing"):
    token_ids.stored(source, tiny_tokenizer())
  with pytest.raises(DataError, match="incomplete"):
    pipeline.mlm_pipeline(source, tiny_tokenizer(), seq_len=16, batch_size=8)


def test_prepare_rebuilds_ids_a_killed_prepare_left_without_a_manifest(tmp_path, caplog):
  out = _prepare(tmp_path)
  config = builders.SourceConfig(name="c", source=str(tmp_path / "c-src"),
                                 tokenizer=_vocab_file(tmp_path))
  stamp = builders.fingerprint("text_corpus", config)
  assert builders.stale(out, stamp) is None
  (out / "token_ids" / "manifest.json").unlink()
  (out / "token_ids" / "train-00000.tokens.bin").write_bytes(b"\0" * 24)  # cut short too
  assert builders.stale(out, stamp) == "token ids incomplete or in an older layout"
  caplog.set_level(logging.INFO, logger="jaxencoder")
  again = builders.prepare("text_corpus", tmp_path / "c-src", tmp_path / "tfds", name="c",
                           tokenizer=_vocab_file(tmp_path))
  assert "text_corpus/c: token ids incomplete or in an older layout: rebuilding" in caplog.text
  source, tok = sources.open_source(str(again)), tiny_tokenizer()
  stored, _ = token_ids.stored(source, tok)
  every = list(range(len(source)))
  _assert_rows_equal(stored.rows(every, 16, tok.pad_id),
                     token_ids.encode_rows(pipeline.read_examples(source, every), tok, 16))


def _set_format(out, value) -> None:
  manifest = out / "token_ids" / "manifest.json"
  manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format": value}))


def test_a_manifest_in_another_format_is_refused_naming_it(tmp_path):
  out = _prepare(tmp_path)
  _set_format(out, 1)
  with pytest.raises(DataError, match=r"token ids in format 1, this jaxencoder reads format 2"):
    token_ids.stored(sources.open_source(str(out)), tiny_tokenizer())


def test_prepare_rebuilds_ids_whose_manifest_is_in_another_format(tmp_path, caplog):
  out = _prepare(tmp_path)
  _set_format(out, 1)
  caplog.set_level(logging.INFO, logger="jaxencoder")
  again = builders.prepare("text_corpus", tmp_path / "c-src", tmp_path / "tfds", name="c",
                           tokenizer=_vocab_file(tmp_path))
  assert "rebuilding" in caplog.text
  assert token_ids.read_manifest(again)["format"] == token_ids.FORMAT


# ------------------------------------------------------------------ tfds's spill
def test_a_split_larger_than_the_sort_buffer_spills_and_keeps_its_record_order(
    tmp_path, monkeypatch):
  src = _write_corpus(tmp_path, n=400)
  default = sources.open_source(str(builders.prepare("text_corpus", src, tmp_path / "a",
                                                     name="c")))
  opened = []
  real_open = builders._LOCAL_GFILE.io.gfile.GFile
  monkeypatch.setattr(builders._LOCAL_GFILE.io.gfile, "GFile",
                      lambda path, *a, **kw: opened.append(path) or real_open(path, *a, **kw))
  monkeypatch.setattr(builders, "SORT_IN_MEMORY", 200)
  spilled = sources.open_source(str(builders.prepare("text_corpus", src, tmp_path / "b",
                                                     name="c")))
  assert len(set(opened)) > 50  # bucket files of the spill, through the plain-file gfile
  assert len(spilled) == len(default) == 400
  every = list(range(400))
  fields = lambda source: [(ex["text"], ex["origin"])
                           for ex in pipeline.read_examples(source, every)]
  assert fields(spilled) == fields(default)
  assert not any(os.path.exists(p) for p in opened)  # the buckets are removed


# ------------------------------------------------------------------ tokenising processes
@pytest.mark.slow
def test_tokenising_in_processes_writes_the_bytes_of_one_process(tmp_path, monkeypatch):
  out = _prepare(tmp_path, n=300)
  monkeypatch.setattr(token_ids, "TASK_BYTES", 400)  # many tasks, sized by the parent
  monkeypatch.setattr(token_ids, "SHARD_TOKENS", 300)
  one, two = tmp_path / "one", tmp_path / "two"
  for copy in (one, two):
    shutil.copytree(out, copy)
    shutil.rmtree(copy / "token_ids")
  tok, tasks = tiny_tokenizer(), []
  encode_range = token_ids._encode_range
  with monkeypatch.context() as counting:  # in this process only: a lambda does not pickle
    counting.setattr(token_ids, "_encode_range",
                     lambda *a: tasks.append(a[-2:]) or encode_range(*a))
    token_ids.write(one, tok, processes=1, progress=False)
  assert len(tasks) > 10 and tasks[-1][-1] == 300
  token_ids.write(two, tok, processes=2, progress=False)
  assert token_ids.read_manifest(one) == token_ids.read_manifest(two)
  names = sorted(p.name for p in (one / "token_ids").iterdir())
  assert names == sorted(p.name for p in (two / "token_ids").iterdir())
  assert sum(n.endswith(".bin") for n in names) > 4
  for name in names:
    assert (one / "token_ids" / name).read_bytes() == (two / "token_ids" / name).read_bytes(), name


# ------------------------------------------------------------------ ranged reads
def test_range_reader_returns_the_bytes_of_each_range(tmp_path):
  data = np.random.default_rng(0).integers(0, 256, 10_000, dtype=np.uint8).tobytes()
  other = bytes(range(256)) * 3
  (tmp_path / "a.bin").write_bytes(data)
  (tmp_path / "b.bin").write_bytes(other)
  a, b = str(tmp_path / "a.bin"), str(tmp_path / "b.bin")
  reader = byte_ranges.RangeReader()
  starts, stops = [9_000, 0, 17, 17, 10_000, 4096], [10_000, 10_000, 17, 4_000, 10_000, 8193]
  assert reader.read(a, starts, stops) == [data[s:e] for s, e in zip(starts, stops)]
  got = reader.read_many([b, a, b], [700, 5, 0], [768, 9, 1])
  assert got == [other[700:768], data[5:9], other[0:1]]
  assert reader.read_many([], [], []) == []


def test_a_range_past_the_end_of_a_file_is_an_oserror_naming_it(tmp_path):
  path = tmp_path / "short.bin"
  path.write_bytes(b"x" * 100)
  with pytest.raises(OSError, match=rf"{path}: read 20 of 30 bytes at 80"):
    byte_ranges.RangeReader().read(str(path), [0, 80], [10, 110])


def test_range_reader_reads_ranges_of_a_gcs_object(gcs, tmp_path):
  data = np.random.default_rng(1).integers(0, 256, 5_000, dtype=np.uint8).tobytes()
  (tmp_path / "r").mkdir()
  (tmp_path / "r" / "a.bin").write_bytes(data)
  (tmp_path / "r" / "b.bin").write_bytes(data[::-1])
  copy_tree(tmp_path / "r", gcs.url("ranges"))
  a, b = gcs.url("ranges/a.bin"), gcs.url("ranges/b.bin")
  got = byte_ranges.RangeReader().read_many([a, b, a, a], [0, 10, 4_990, 100],
                                            [5_000, 20, 5_000, 100])
  assert got == [data, data[::-1][10:20], data[4_990:], b""]


@pytest.mark.parametrize("name, start, stop", [("short.bin", 80, 110), ("short.bin", 120, 130),
                                               ("missing.bin", 0, 10)])
def test_a_range_a_gcs_object_lacks_is_an_oserror_naming_it(gcs, tmp_path, name, start, stop):
  (tmp_path / "s").mkdir()
  (tmp_path / "s" / "short.bin").write_bytes(b"x" * 100)
  copy_tree(tmp_path / "s", gcs.url("short"))
  url = gcs.url(f"short/{name}")
  with pytest.raises(OSError, match=url):
    byte_ranges.RangeReader().read(url, [0, start], [10, stop])


@pytest.fixture(scope="module")
def on_gcs(gcs, sharded):
  """The sharded dataset and its copy on the emulator."""
  out, source = sharded
  url = copy_tree(out, gcs.url("scale/c/1.0.0"), last="dataset_info.json")
  return source, sources.open_source(str(url))


def test_stored_ids_on_gcs_give_the_rows_of_the_local_copy(on_gcs):
  local, remote = on_gcs
  tok = tiny_tokenizer()
  (here, _), (there, _) = token_ids.stored(local, tok), token_ids.stored(remote, tok)
  assert there.dir.startswith("gs://")
  index = np.random.default_rng(2).permutation(len(local))
  for seq_len in (6, 40):
    _assert_rows_equal(there.rows(index, seq_len, tok.pad_id),
                       here.rows(index, seq_len, tok.pad_id))


def test_mlm_batches_read_from_gcs_equal_the_local_ones(on_gcs):
  local, remote = on_gcs
  def batches(source):
    return list(pipeline.mlm_pipeline(source, tiny_tokenizer(), seq_len=16, batch_size=8,
                                      read=Reading(seed=4, **ONE)))
  assert_batches_equal(batches(remote), batches(local))


# ------------------------------------------------------------------ held-out views
def test_holdout_views_pick_the_records_of_the_old_index_arrays():
  from jaxencoder.data.splits import Holdout
  for n in range(1, 41):
    source = [f"r{i}" for i in range(n)]
    idx = np.arange(n)
    for every in range(2, 7):
      for held_out, want in ((False, idx[idx % every != 0]), (True, idx[idx % every == 0])):
        view = Holdout(source, every, held_out)
        assert len(view) == len(want), (n, every, held_out)
        np.testing.assert_array_equal(view.records(np.arange(len(view))), want)
        assert [view[i] for i in range(len(view))] == [source[i] for i in want]
        assert view.__getitems__(list(range(len(view)))[::-1]) == [source[i] for i in want[::-1]]


def test_a_holdout_seed_holds_out_another_fold_and_the_two_views_still_partition():
  from jaxencoder.data.splits import Holdout
  for n in range(1, 30):
    source, idx = list(range(n)), np.arange(n)
    for every in range(2, 6):
      for seed in range(0, 2 * every):
        kept, held = (Holdout(source, every, held_out, seed=seed) for held_out in (False, True))
        want_held = idx[idx % every == seed % every]
        np.testing.assert_array_equal(held.records(np.arange(len(held))), want_held)
        np.testing.assert_array_equal(kept.records(np.arange(len(kept))),
                                      idx[idx % every != seed % every])


@pytest.mark.parametrize("held_out", [False, True])
def test_stored_ids_of_a_holdout_view_are_its_records_ids(sharded, held_out):
  from jaxencoder.data.splits import Holdout
  _, source = sharded
  tok = tiny_tokenizer()
  view = Holdout(source, 7, held_out)
  idx = np.arange(len(source))
  want = idx[idx % 7 == 0] if held_out else idx[idx % 7 != 0]
  stored, records = token_ids.stored(view, tok)
  np.testing.assert_array_equal(records(np.arange(len(view))), want)
  picks = np.random.default_rng(0).permutation(len(view))
  _assert_rows_equal(pipeline.text_rows(view, (stored, records), picks, tok, 16),
                     token_ids.encode_rows(pipeline.read_examples(source, want[picks].tolist()),
                                           tok, 16))


# ------------------------------------------------------------------ mixtures: weights
def test_parse_weights_reads_names_and_relative_weights():
  assert parse_weights("a:0.7,b:0.3") == [("a", 0.7), ("b", 0.3)]
  assert parse_weights(" shakespeare , austen:2 ,") == [("shakespeare", 1.0), ("austen", 2.0)]
  assert parse_weights("/data/tfds/text_corpus/c:3") == [("/data/tfds/text_corpus/c", 3.0)]


@pytest.mark.parametrize("spec, message", [
    ("a:0", "entry 'a:0'"), ("a:x", "entry 'a:x'"), ("b:1,a:-1", "entry 'a:-1'"),
    ("a:inf", "entry 'a:inf'"), ("a:nan", "entry 'a:nan'"), (":2", "entry ':2'"),
    ("a:1,b,a:2", "names a source twice"), ("", "is empty"), (" , ", "is empty")])
def test_parse_weights_refuses_a_bad_entry_naming_it(spec, message):
  with pytest.raises(ValueError, match=message):
    parse_weights(spec)


def test_a_gcs_source_without_a_weight_weighs_one():
  assert parse_weights("gs://bucket/tfds/a,gs://bucket/tfds/b:3") == [
      ("gs://bucket/tfds/a", 1.0), ("gs://bucket/tfds/b", 3.0)]


def _mix(sizes=(70, 30), weights=(0.7, 0.3)):
  return Mixture([list(range(n)) for n in sizes], list(weights), ["a", "b"][: len(sizes)])


def test_every_prefix_of_a_mixture_keeps_the_weights_shares():
  mix = _mix()
  assert mix.weights == pytest.approx([0.7, 0.3])
  shares = mix.proportions(1000)
  assert shares["a"] == pytest.approx(0.7, abs=0.01) and shares["b"] == pytest.approx(0.3, abs=0.01)
  order = mix.order(seed=3, num_epochs=None)
  firsts = np.cumsum([order[g][0] == 0 for g in range(1000)])
  assert np.abs(firsts - 0.7 * np.arange(1, 1001)).max() <= 1  # up to one example
  thirds = _mix(weights=(3, 1)).proportions(400)
  assert thirds == {"a": 0.75, "b": 0.25}


def test_a_mixtures_order_is_a_function_of_the_seed_and_the_global_index():
  order = _mix().order(seed=5, num_epochs=None)
  in_sequence = [order[g] for g in range(300)]
  alone = {g: _mix().order(seed=5, num_epochs=None)[g] for g in reversed(range(300))}
  assert [alone[g] for g in range(300)] == in_sequence
  assert [_mix().order(seed=6, num_epochs=None)[g] for g in range(300)] != in_sequence
  assert [_mix().order(seed=None, num_epochs=None)[g] for g in range(300)] != in_sequence


def test_a_mixture_reads_every_record_of_each_member_once_per_epoch():
  sizes = (70, 30)
  order = _mix(sizes).order(seed=5, num_epochs=None)
  picks = [order[g] for g in range(400)]
  for k, size in enumerate(sizes):
    records = [r for m, r in picks if m == k]
    for epoch in range(2):
      one = records[epoch * size: (epoch + 1) * size]
      assert sorted(one) == list(range(size)), (k, epoch)
      assert one != sorted(one)  # shuffled
  once = _mix(sizes).order(seed=5, num_epochs=1)
  assert len(once) >= 99
  seen = [once[g] for g in range(len(once))]
  assert len(set(seen)) == len(seen)  # one pass: no record twice


# ------------------------------------------------------------------ mixtures: batches
@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
  """Two prepared corpora with stored ids (120 and 50 examples) mixed 0.7 / 0.3."""
  root = tmp_path_factory.mktemp("mixed")
  a = sources.open_source(str(_prepare(root, "a", n=120, seed=0)))
  b = sources.open_source(str(_prepare(root, "b", n=50, seed=1)))
  return Mixture([a, b], [0.7, 0.3], ["a", "b"])


def _mixed_batches(mix, n, *, batch_size=8, mode="pad", mask=None, use_stored_ids=True,
                   **reading):
  read = Reading(**{**dict(seed=3, num_epochs=None, **ONE), **reading})
  return _take(pipeline.mlm_pipeline(mix, tiny_tokenizer(), seq_len=16, batch_size=batch_size,
                                     mode=mode, mask=mask,
                                     text=pipeline.TextInput(stored_ids=use_stored_ids),
                                     read=read), n)


@pytest.mark.parametrize("mode", ["pad", "pack", "best_fit"])
def test_mixture_batches_from_stored_ids_equal_tokenising(mixed, mode):
  assert_batches_equal(_mixed_batches(mixed, 6, mode=mode),
                        _mixed_batches(mixed, 6, mode=mode, use_stored_ids=False))


def test_mixture_batch_rows_are_the_picked_examples_tokenised(mixed):
  tok = tiny_tokenizer()
  plain = pipeline.default_mask(tok, rate=0.0)
  batches = _mixed_batches(mixed, 6, mask=plain)
  order = mixed.order(3, None)
  for k, batch in enumerate(batches):
    picks = [order[g] for g in range(8 * k, 8 * k + 8)]
    examples = [mixed.members[m][r] for m, r in picks]
    ids, _, lengths = token_ids.encode_rows(examples, tok, 16)
    np.testing.assert_array_equal(batch["input_ids"], ids)
    np.testing.assert_array_equal(batch["attention_mask"].sum(1), lengths)
  members = {m for b in range(6) for m, _ in (order[g] for g in range(8 * b, 8 * b + 8))}
  assert members == {0, 1}


@pytest.mark.parametrize("mode", ["pad", "pack", "best_fit"])
def test_a_resumed_mixture_pipeline_goes_on_exactly(mixed, mode):
  whole = _mixed_batches(mixed, 7, mode=mode)
  read = Reading(seed=3, num_epochs=None, **ONE)
  make = lambda: pipeline.mlm_pipeline(mixed, tiny_tokenizer(), seq_len=16, batch_size=8,
                                       mode=mode, read=read)
  it = iter(make())
  assert_batches_equal([next(it) for _ in range(3)], whole[:3])
  state = it.get_state()
  resumed = iter(make())
  resumed.set_state(state)
  assert_batches_equal([next(resumed) for _ in range(4)], whole[3:7])


def test_two_processes_read_their_rows_of_the_same_mixture_batches(mixed):
  """Process p reads the b rows at offset p*b of every global batch of 2b rows
  (pipeline.py's sharding): stacked, they are the one-process batches, masks included."""
  whole = _mixed_batches(mixed, 5, batch_size=8)
  parts = [_mixed_batches(mixed, 5, batch_size=4, shard_index=p, shard_count=2)
           for p in range(2)]
  for k, batch in enumerate(whole):
    for key, value in batch.items():
      np.testing.assert_array_equal(np.concatenate([parts[0][k][key], parts[1][k][key]]), value,
                                    err_msg=f"batch {k}, {key}")


def test_a_process_with_only_fill_rows_in_the_last_mixture_batch_gets_zero_rows(mixed):
  # one pass of 120/50 at 0.7/0.3 is 166 examples: the last global batch of 2 x 8 holds 6,
  # all in process 0's rows
  read = lambda p: Reading(seed=3, num_epochs=1, shard_index=p, shard_count=2)
  parts = [list(pipeline.mlm_pipeline(mixed, tiny_tokenizer(), seq_len=16, batch_size=8,
                                      read=read(p))) for p in range(2)]
  assert len(parts[0]) == len(parts[1]) == -(-len(mixed.order(3, 1)) // 16)
  assert not parts[1][-1]["attention_mask"].any()


@pytest.mark.slow
def test_worker_processes_make_the_same_mixture_batches(mixed):
  assert_batches_equal(_mixed_batches(mixed, 6, workers=2), _mixed_batches(mixed, 6))


# ------------------------------------------------------------------ make_pipelines
def _mixture_config(root, sources_spec, **data):
  from jaxencoder.tokenizer import default_tokenizer_path
  from jaxencoder.train.config import base_config
  config = base_config()
  config.data.kind = "text_corpus"
  config.data.sources = sources_spec
  config.data.tokenizer = str(default_tokenizer_path())
  config.data.data_dir = str(root)
  config.data.seq_len = 16
  config.data.workers = 0
  config.batch_size = config.eval_batch_size = 8
  config.num_train_steps = 100
  for key, value in data.items():
    config.data[key] = value
  return config


def test_make_pipelines_mixes_data_sources_in_their_weights(tmp_path, caplog):
  from jaxencoder.tokenizer import Tokenizer, default_tokenizer_path
  from jaxencoder.train.config import finalize
  from jaxencoder.train.datasets import make_pipelines
  minilm = str(default_tokenizer_path())
  a = _prepare(tmp_path, "a", n=120, seed=0, tokenizer=minilm)
  b = _prepare(tmp_path, "b", n=60, seed=1, tokenizer=minilm)
  config = _mixture_config(tmp_path, f"{a}:3,{b}:1")
  assert config.model.vocab_size == Tokenizer.from_file(minilm).vocab_size
  caplog.set_level(logging.INFO, logger="jaxencoder")
  pipelines = make_pipelines(finalize(config))
  assert (f"data mixture over the first 800 train examples: {a} 75.0% (weight 0.750), "
          f"{b} 25.0% (weight 0.250)") in caplog.text
  train = _take(pipelines.train, 3)
  assert all(batch["input_ids"].shape == (8, 16) for batch in train)
  assert all(batch["attention_mask"].sum() > 0 for batch in train)
  evals = list(pipelines.make_eval())
  assert evals and all(batch["input_ids"].shape == (8, 16) for batch in evals)


def test_data_sources_of_another_kind_are_a_data_error(tmp_path):
  from jaxencoder.train.datasets import make_pipelines
  config = _mixture_config(tmp_path, "x:1,y:1", kind="text_classification")
  with pytest.raises(DataError, match="data.sources mixes text_corpus sources; data.kind is "
                     "'text_classification'"):
    make_pipelines(config)


# ------------------------------------------------------------------ memory
PREPARE = """
import json, pathlib, resource, sys
import numpy as np
from jaxencoder.data import builders
root, mb = pathlib.Path(sys.argv[1]), float(sys.argv[2])
words = np.array(sys.argv[3].split())
rng, src, written = np.random.default_rng(0), root / "src", 0
src.mkdir(parents=True)
with open(src / "a.txt", "w") as f:
  while written < mb * 2**20:  # paragraphs of 50..400 words
    n = rng.integers(50, 400, 500)
    parts = np.split(words[rng.integers(0, len(words), n.sum())], np.cumsum(n)[:-1])
    text = "\\n\\n".join(" ".join(p) for p in parts) + "\\n\\n"
    f.write(text)
    written += len(text)
out = builders.prepare("text_corpus", src, root / "tfds", name="big",
                       tokenizer=sys.argv[4], processes=1)
print(json.dumps({"peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "bytes": written, "out": str(out)}))
"""

READ = """
import json, sys
from jaxencoder.data import pipeline, sources
from jaxencoder.data.pipeline import Reading
from jaxencoder.tokenizer import Tokenizer
def rss_mb():
  with open("/proc/self/status") as f:
    return next(int(l.split()[1]) / 1024 for l in f if l.startswith("VmRSS:"))
source = sources.open_source(sys.argv[1])
it = iter(pipeline.mlm_pipeline(source, Tokenizer.from_file(sys.argv[2]), seq_len=128,
                                batch_size=128,
                                read=Reading(seed=0, num_epochs=None, shard_index=0,
                                             shard_count=1)))
next(it)
first, tokens = rss_mb(), 0
for _ in range(200):
  tokens += int(next(it)["attention_mask"].sum())
print(json.dumps({"first_mb": first, "last_mb": rss_mb(), "tokens": tokens,
                  "examples": len(source)}))
"""


def _prepare_in_subprocess(root: pathlib.Path, mb: float) -> dict:
  root.mkdir(parents=True, exist_ok=True)
  run = subprocess.run([sys.executable, "-c", PREPARE, str(root), str(mb), " ".join(WORDS),
                        _vocab_file(root)], capture_output=True, text=True, timeout=600,
                       cwd=REPO)
  assert run.returncode == 0, run.stderr[-3000:]
  return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def big_corpus(tmp_path_factory, worker_id):
  """A ~40 MB corpus and a ~2 MB one prepared (tiny vocab ids) in subprocesses, once per
  session (xdist workers share them through a file lock): their prepare's peak RSS."""
  build = lambda root: {"big": _prepare_in_subprocess(root / "big", 40),  # noqa: E731
                        "small": _prepare_in_subprocess(root / "small", 2)}
  return built_once(tmp_path_factory, worker_id, "corpus_scale", build)[1]


@pytest.mark.slow
def test_prepare_memory_does_not_grow_with_the_corpus(big_corpus):
  big, small = big_corpus["big"], big_corpus["small"]
  assert big["bytes"] > 15 * small["bytes"]
  manifest = token_ids.read_manifest(big["out"])
  assert manifest["splits"]["train"]["tokens"] > 7_000_000  # ~60 MB of (id, word) pairs
  assert big["peak_mb"] - small["peak_mb"] < 150, (big, small)


@pytest.mark.slow
def test_reading_batches_over_a_large_corpus_keeps_memory_flat(big_corpus):
  big = big_corpus["big"]
  run = subprocess.run([sys.executable, "-c", READ, big["out"],
                        str(pathlib.Path(big["out"]).parents[3] / "vocab.txt")],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
  assert run.returncode == 0, run.stderr[-3000:]
  result = json.loads(run.stdout.strip().splitlines()[-1])
  assert result["tokens"] > 200 * 128 * 100  # rows from all over the corpus were read
  assert result["last_mb"] - result["first_mb"] < 30, result


# ------------------------------------------------------------------ sources a user has
def test_a_tfds_datasets_texts_become_the_same_stored_ids(tmp_path):
  """text_corpus from a prepared tfds dataset (its dir, or tfds:NAME + tfds_data_dir):
  its texts in every split, stored ids equal to tokenising them."""
  first = builders.prepare("text_corpus", _write_corpus(tmp_path, "raw", n=40), tmp_path / "a",
                           name="orig")
  (first / "dummy_test_split_note.txt").write_text("not part of any split\n")
  vocab, tok = _vocab_file(tmp_path), tiny_tokenizer()
  for i, (source, extra) in enumerate([(str(first), {}),
                                       ("tfds:text_corpus/orig", {"tfds_data_dir": str(
                                           tmp_path / "a")})]):
    out = builders.prepare("text_corpus", source, tmp_path / "b", name=f"t{i}",
                           text_feature="text", tokenizer=vocab, **extra)
    copy = sources.open_source(str(out))
    assert sorted(_texts(copy)) == sorted(_texts(sources.open_source(str(first))))
    assert {ex["origin"].decode().rsplit("[", 1)[0] for ex in pipeline.read_examples(
        copy, range(len(copy)))} == {"text_corpus/orig/1.0.0/train"}
    stored, _ = token_ids.stored(copy, tok)
    every = list(range(len(copy)))
    _assert_rows_equal(stored.rows(every, 12, tok.pad_id),
                       token_ids.encode_rows(pipeline.read_examples(copy, every), tok, 12))


def test_a_tfds_source_names_its_features_when_the_text_feature_is_wrong(tmp_path):
  first = builders.prepare("text_corpus", _write_corpus(tmp_path, "raw", n=10), tmp_path / "a",
                           name="orig")
  with pytest.raises(DataError, match=r"no feature 'body' to read text from; it has origin, "
                     r"text: pass --text-feature"):
    builders.prepare("text_corpus", str(first), tmp_path / "b", name="x", text_feature="body")


def test_a_glob_source_reads_the_matching_files_of_its_folder(tmp_path):
  src = tmp_path / "raw"
  src.mkdir()
  (src / "keep1.txt").write_text("the cat sat\n\nthe dog ran\n")
  (src / "keep2.txt").write_text("a bird flew\n")
  (src / "skip.md").write_text("not this\n")
  out = builders.prepare("text_corpus", f"{src}/keep*.txt", tmp_path / "tfds", name="g")
  assert sorted(_texts(sources.open_source(str(out)))) == ["a bird flew", "the cat sat",
                                                           "the dog ran"]
  with pytest.raises(ValueError, match="only the last part of a source may hold"):
    builders.prepare("text_corpus", f"{tmp_path}/r*/keep1.txt", tmp_path / "tfds", name="h")


def test_a_gcs_prefix_of_text_files_prepares_with_object_digests(gcs, tmp_path):
  """A bucket prefix (glob) is read in place; its fingerprint keeps the objects' stored
  digests, so an unchanged bucket is "up to date" and a changed object rebuilds."""
  from jaxencoder.io.paths import as_path
  as_path(gcs.url("web/a.txt")).write_text("the cat sat\n\nthe dog ran\n")
  as_path(gcs.url("web/b.txt")).write_text("a bird flew\n")
  out = builders.prepare("text_corpus", gcs.url("web/*.txt"), tmp_path / "tfds", name="w",
                         tokenizer=_vocab_file(tmp_path))
  stamp = json.loads((out / "fingerprint.json").read_text())
  assert sorted(stamp["files"]) == ["a.txt", "b.txt"]
  assert all(v.startswith("object:") for v in stamp["files"].values())
  assert len(sources.open_source(str(out))) == 3
  config = builders.SourceConfig(name="w", source=gcs.url("web"), pattern="*.txt",
                                 tokenizer=_vocab_file(tmp_path))
  assert builders.stale(out, builders.fingerprint("text_corpus", config)) is None
  as_path(gcs.url("web/b.txt")).write_text("a bird flew away\n")
  assert "sources changed (b.txt)" in builders.stale(out, builders.fingerprint("text_corpus",
                                                                                config))


def test_a_paragraph_with_no_word_token_is_refused_at_prepare_naming_it(tmp_path):
  src = tmp_path / "raw"
  src.mkdir()
  (src / "a.txt").write_text("the cat sat\n\n\x01\x02\n\nthe dog ran\n")  # control chars only
  with pytest.raises(DataError, match=r"a.txt:3: zero-length sequence"):
    builders.prepare("text_corpus", src, tmp_path / "tfds", name="z",
                     tokenizer=_vocab_file(tmp_path))


def test_an_ids_only_corpus_gives_the_batches_of_the_full_one(tmp_path):
  """--ids-only keeps the token ids alone (no records): the same MLM batches as the
  dataset with records, and a clear error where a task would read the texts."""
  src, vocab, tok = _write_corpus(tmp_path, "raw"), _vocab_file(tmp_path), tiny_tokenizer()
  full = builders.prepare("text_corpus", src, tmp_path / "tfds", name="full", tokenizer=vocab)
  ids = builders.prepare("text_corpus", src, tmp_path / "tfds", name="ids", tokenizer=vocab,
                         ids_only=True)
  assert not (ids / "dataset_info.json").exists() and (ids / "token_ids/manifest.json").exists()
  for name in (str(ids), "text_corpus/ids"):
    source = sources.open_source(name, "train", tmp_path / "tfds")
    assert len(source) == 120
    read = Reading(seed=2, **ONE)
    assert_batches_equal(
        _take(pipeline.mlm_pipeline(source, tok, seq_len=16, batch_size=8, read=read), 5),
        _take(pipeline.mlm_pipeline(sources.open_source(str(full)), tok, seq_len=16,
                                    batch_size=8, read=read), 5))
  with pytest.raises(DataError, match=r"holds token ids only \(prepared with --ids-only\)"):
    pipeline.read_examples(source, [0])
  caplog_free = builders.prepare("text_corpus", src, tmp_path / "tfds", name="ids",
                                 tokenizer=vocab, ids_only=True)
  assert caplog_free == ids
  with pytest.raises(ValueError, match="needs a tokenizer"):
    builders.prepare("text_corpus", src, tmp_path / "tfds", name="x", ids_only=True)
