"""Each tfds builder round-trips small files through array_record and back."""

import gzip

import numpy as np
import pytest

from jaxencoder.data import builders, readers, sources


def _decode(x):
  return x.decode() if isinstance(x, bytes) else x


def _all(path, split="train"):
  src = sources.open_source(str(path), split)
  return src.__getitems__(list(range(len(src))))


def test_text_corpus_round_trip(tmp_path):
  (tmp_path / "src").mkdir()
  (tmp_path / "src" / "a_gut.txt").write_bytes("Caf\xe9 one\n\ntwo\nlines\n".encode("latin-1"))
  (tmp_path / "src" / "skip.md").write_text("not read")
  path = builders.prepare("text_corpus", tmp_path / "src", tmp_path / "tfds", name="c",
                          pattern="*_gut.txt", encoding="latin-1")
  texts = sorted(_decode(r["text"]) for r in _all(path))
  assert texts == ["Caf\u00e9 one", "two lines"]


def test_text_classification_round_trip_with_pairs(tmp_path):
  (tmp_path / "src").mkdir()
  (tmp_path / "src" / "train.tsv").write_text("text\ttext_b\tlabel\na\tb\tyes\nc\td\tno\n")
  (tmp_path / "src" / "test.tsv").write_text("text\ttext_b\tlabel\ne\tf\tyes\n")
  path = builders.prepare("text_classification", tmp_path / "src", tmp_path / "tfds", name="x")
  names = sources.label_names(str(path))
  assert names == ["no", "yes"]
  rows = {_decode(r["text"]): (_decode(r["text_b"]), names[r["label"]]) for r in _all(path)}
  assert rows == {"a": ("b", "yes"), "c": ("d", "no")}
  assert [_decode(r["text"]) for r in _all(path, "test")] == ["e"]


def test_classification_unknown_label_fails_prepare(tmp_path):
  (tmp_path / "src").mkdir()
  (tmp_path / "src" / "labels.txt").write_text("neg\npos\n")
  (tmp_path / "src" / "train.csv").write_text("text,label\ngood,pos\nhm,maybe\n")
  with pytest.raises(readers.DataError, match=r"train.csv:3: label 'maybe'"):
    builders.prepare("text_classification", tmp_path / "src", tmp_path / "tfds")


def test_tagged_tokens_round_trip_slash_and_conllu(tmp_path):
  (tmp_path / "src").mkdir()
  (tmp_path / "src" / "wsj.txt").write_text("The/DT cat/NN ./.\n")
  (tmp_path / "src" / "ud.conllu").write_text(
      "1\tDogs\tdog\tNOUN\t_\t_\t0\troot\t_\t_\n\n")
  path = builders.prepare("tagged_tokens", tmp_path / "src", tmp_path / "tfds", name="t")
  names = sources.label_names(str(path), feature="tags")
  got = sorted(([_decode(w) for w in r["words"]], [names[t] for t in r["tags"]])
               for r in _all(path))
  assert got == [(["Dogs"], ["NOUN"]), (["The", "cat", "."], ["DT", "NN", "."])]


def test_tagged_tokens_labels_txt_orders_the_tags_and_is_no_data_file(tmp_path):
  (tmp_path / "src").mkdir()
  (tmp_path / "src" / "train.txt").write_text("The/DT cat/NN\n")
  (tmp_path / "src" / "labels.txt").write_text("NN\nDT\nVB\n")
  path = builders.prepare("tagged_tokens", tmp_path / "src", tmp_path / "tfds", name="t")
  names = sources.label_names(str(path), feature="tags")
  assert names == ["NN", "DT", "VB"]
  assert [[names[t] for t in r["tags"]] for r in _all(path)] == [["DT", "NN"]]


def _idx(path, array):
  header = bytes([0, 0, 8, array.ndim]) + np.array(array.shape, ">u4").tobytes()
  path.write_bytes(gzip.compress(header + array.astype(np.uint8).tobytes()))


def test_image_arrays_round_trip_idx(tmp_path):
  (tmp_path / "src").mkdir()
  images = np.arange(3 * 4 * 5).reshape(3, 4, 5).astype(np.uint8)
  _idx(tmp_path / "src" / "train-images-idx3-ubyte.gz", images)
  _idx(tmp_path / "src" / "train-labels-idx1-ubyte.gz", np.array([2, 0, 1]))
  path = builders.prepare("image_arrays", tmp_path / "src", tmp_path / "tfds", name="i")
  got = sorted((int(r["label"]), r["image"].tobytes()) for r in _all(path))
  assert got == sorted((int(y), x[..., None].tobytes()) for x, y in zip(images, [2, 0, 1]))


def test_image_arrays_round_trip_npz(tmp_path):
  x = np.random.default_rng(0).integers(0, 255, (4, 2, 2, 3)).astype(np.uint8)
  np.savez(tmp_path / "d.npz", x_train=x, y_train=np.arange(4), x_test=x[:1], y_test=[3])
  path = builders.prepare("image_arrays", tmp_path / "d.npz", tmp_path / "tfds", name="n")
  assert len(_all(path)) == 4 and len(_all(path, "test")) == 1
  assert all(np.array_equal(r["image"], x[r["label"]]) for r in _all(path))


def test_time_series_round_trip_multichannel(tmp_path):
  (tmp_path / "src").mkdir()
  head = "@problemName m\n@classLabel true up down\n@data\n"
  (tmp_path / "src" / "M_TRAIN.ts").write_text(head + "1,2,3:4,5,6:up\n7,8:9,10:down\n")
  path = builders.prepare("time_series", tmp_path / "src", tmp_path / "tfds", name="s")
  got = {r["label"]: r["series"] for r in _all(path)}
  np.testing.assert_array_equal(got[0], [[1, 4], [2, 5], [3, 6]])
  np.testing.assert_array_equal(got[1], [[7, 9], [8, 10]])
  assert sources.label_names(str(path)) == ["up", "down"]


def test_open_source_by_kind_name_and_missing_dataset(tmp_path):
  (tmp_path / "a.txt").write_text("x\n")
  builders.prepare("text_corpus", tmp_path / "a.txt", tmp_path / "tfds", name="one")
  assert len(sources.open_source("text_corpus/one", "train", tmp_path / "tfds")) == 1
  with pytest.raises(readers.DataError, match="no split 'test'"):
    sources.open_source("text_corpus/one", "test", tmp_path / "tfds")
  with pytest.raises(readers.DataError, match="unknown data source .no_such_dataset_xyz."):
    sources.open_source("no_such_dataset_xyz", "train", tmp_path / "tfds")
