import pathlib

import numpy as np
import pytest

from data_helpers import tiny_tokenizer
from jaxencoder import tokenizer as tok_lib


@pytest.mark.parametrize("name", ["vocab.txt", "tokenizer.json", ""])
def test_minilm_ids_for_time_flies(name, minilm):
  tok = tok_lib.Tokenizer.from_file(minilm / name)
  enc = tok.encode("Time flies like an arrow")
  assert enc["input_ids"].tolist() == [101, 2051, 10029, 2066, 2019, 8612, 102]
  assert enc["input_ids"].dtype == np.int32
  assert (tok.vocab_size, tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (
      30522, 0, 100, 101, 102, 103)


def test_pair_encoding_sets_type_ids_and_pads(minilm):
  tok = tok_lib.Tokenizer.from_file(minilm)
  enc = tok.encode("time flies", "like an arrow", max_length=12, padding="max_length")
  assert enc["input_ids"].tolist() == [101, 2051, 10029, 102, 2066, 2019, 8612, 102, 0, 0, 0, 0]
  assert enc["token_type_ids"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0]
  assert enc["attention_mask"].tolist() == [1] * 8 + [0] * 4


def test_word_to_first_subword_alignment(minilm):
  tok = tok_lib.Tokenizer.from_file(minilm)
  enc = tok.encode(["unbelievably", "fast", "antidisestablishment"], is_pretokenized=True)
  pieces = [tok.hf.id_to_token(int(i)) for i in enc["input_ids"]]
  assert pieces == ["[CLS]", "un", "##bel", "##ie", "##va", "##bly", "fast", "anti", "##dis",
                    "##est", "##ab", "##lish", "##ment", "[SEP]"]
  assert enc["first_subword_index"].tolist() == [1, 6, 7]
  assert enc["word_ids"].tolist() == [-1, 0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2, -1]


def test_encode_batch_truncates_and_pads_to_fixed_length():
  tok = tiny_tokenizer()
  batch = tok.encode_batch(["the cat sat on a mat", "dog"], max_length=5, pad_to=7)
  assert batch["input_ids"].shape == (2, 7)
  assert batch["attention_mask"].sum(axis=1).tolist() == [5, 3]
  assert batch["input_ids"][0, 4] == tok.sep_id
  assert (batch["input_ids"][1, 3:] == tok.pad_id).all()


def test_decode_skips_specials_and_round_trips():
  tok = tiny_tokenizer()
  ids = tok.encode("The quick brown fox", max_length=10, padding="max_length")["input_ids"]
  assert tok.decode(ids) == "the quick brown fox"
  assert set(tok.special_ids.tolist()) == {0, 1, 2, 3, 4}


def test_from_file_errors_name_the_path(tmp_path):
  with pytest.raises(FileNotFoundError, match="neither"):
    tok_lib.Tokenizer.from_file(tmp_path)
  (tmp_path / "vocab.txt").write_text("")
  with pytest.raises(ValueError, match="vocab.txt: vocab file is empty"):
    tok_lib.Tokenizer.from_file(tmp_path)


def test_train_cli_writes_loadable_vocab(tmp_path):
  corpus = tmp_path / "corpus"
  corpus.mkdir()
  (corpus / "a.txt").write_text("the cat sat on the mat\nthe dog sat on the log\n" * 50)
  tok_lib.main(["train", "--input", str(corpus), "--vocab-size", "60",
                 "--out", str(tmp_path / "tok")])
  for name in ("vocab.txt", "tokenizer.json"):
    tok = tok_lib.Tokenizer.from_file(tmp_path / "tok" / name)
    assert tok.vocab_size <= 60
    enc = tok.encode("the cat sat")
    assert enc["input_ids"][0] == tok.cls_id and tok.unk_id not in enc["input_ids"]
    assert tok.decode(enc["input_ids"]) == "the cat sat"


# ------------------------------------------------------------------ byte-level BPE (RoBERTa)
def roberta_style_tokenizer(tmp_path) -> tok_lib.Tokenizer:
  """A byte-level BPE with RoBERTa's specials, trained here; vocab.json + merges.txt."""
  import tokenizers
  from tokenizers import models, pre_tokenizers, trainers
  hf = tokenizers.Tokenizer(models.BPE())
  hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  trainer = trainers.BpeTrainer(vocab_size=300, show_progress=False,
                                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  hf.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainer)
  tmp_path.mkdir(parents=True, exist_ok=True)
  hf.model.save(str(tmp_path))
  return tok_lib.Tokenizer.from_file(tmp_path)


def test_bpe_specials_are_found_by_role(tmp_path):
  tok = roberta_style_tokenizer(tmp_path)
  assert tok.kind == "byte_level_bpe"
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert tok.special_ids.tolist() == [0, 1, 2, 3, 4]
  enc = tok.encode("the fox", "the dog", max_length=16, padding="max_length")
  ids = enc["input_ids"].tolist()
  assert ids[0] == 0 and ids.count(2) == 3  # <s> a </s></s> b </s>
  assert ids[enc["attention_mask"].sum():] == [1] * (16 - enc["attention_mask"].sum())
  assert not enc["token_type_ids"].any()


def test_bpe_pre_split_words_encode_as_the_joined_text(tmp_path):
  tok = roberta_style_tokenizer(tmp_path)
  words = ["the", "quick", "brown", "fox"]
  split = tok.encode(words, is_pretokenized=True)
  joined = tok.encode(" ".join(words))
  np.testing.assert_array_equal(split["input_ids"], joined["input_ids"])
  first = [tok.hf.id_to_token(int(split["input_ids"][i])) for i in split["first_subword_index"]]
  assert first == ["the", "Ġquick", "Ġbrown", "Ġfox"]  # a leading space after the first word
  assert split["word_ids"].tolist() == [-1, 0, 1, 2, 3, -1]


def test_bpe_save_writes_vocab_json_and_merges_and_reloads(tmp_path):
  tok = roberta_style_tokenizer(tmp_path / "src")
  out = tok.save(tmp_path / "out")
  assert {p.name for p in pathlib.Path(out).iterdir()} == {"tokenizer.json", "vocab.json",
                                                          "merges.txt"}
  for source in (out, pathlib.Path(out) / "vocab.json"):
    again = tok_lib.Tokenizer.from_file(source)
    assert again.kind == "byte_level_bpe"
    np.testing.assert_array_equal(again.encode("the lazy dog")["input_ids"],
                                  tok.encode("the lazy dog")["input_ids"])
