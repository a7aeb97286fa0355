"""Bad data raises DataError naming the file and line."""

import gzip

import numpy as np
import pytest

from jaxencoder.data import fetch, readers


def _write(tmp_path, name, text):
  path = tmp_path / name
  path.write_text(text)
  return path


def test_empty_file_is_an_error(tmp_path):
  path = _write(tmp_path, "empty.txt", "  \n\n")
  with pytest.raises(readers.DataError, match=r"empty.txt: file is empty"):
    list(readers.read_documents(path))


def test_label_outside_label_set_names_file_and_line(tmp_path):
  path = _write(tmp_path, "train.csv", "text,label\ngood,pos\nmeh,neutral\n")
  with pytest.raises(readers.DataError, match=r"train.csv:3: label 'neutral' not in label set"):
    list(readers.read_classification(path, labels=["neg", "pos"]))


def test_malformed_csv_row_names_file_and_line(tmp_path):
  path = _write(tmp_path, "train.csv", "text,label\ngood,pos\na,b,c,d\n")
  with pytest.raises(readers.DataError, match=r"train.csv:3: 4 fields, the header has 2"):
    list(readers.read_classification(path))
  path = _write(tmp_path, "dev.csv", "good,pos\na,b,c,d\n")
  with pytest.raises(readers.DataError, match=r"dev.csv:2: expected 2 or 3 columns"):
    list(readers.read_classification(path, columns=readers.Columns(header=False)))


def test_malformed_tagged_token_names_file_and_line(tmp_path):
  path = _write(tmp_path, "tags.txt", "The/DT cat/NN\nsat on/IN\n")
  with pytest.raises(readers.DataError, match=r"tags.txt:2: malformed token 'sat'"):
    list(readers.read_tagged(path))


def test_conllu_wrong_column_count_names_line(tmp_path):
  path = _write(tmp_path, "a.conllu", "# sent\n1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_\n2\tcat\n")
  with pytest.raises(readers.DataError, match=r"a.conllu:3: CoNLL-U line has 2 columns"):
    list(readers.read_tagged(path))


def test_zero_length_series_and_bad_value_name_line(tmp_path):
  head = "@problemName x\n@classLabel true a b\n@data\n"
  path = _write(tmp_path, "X_TRAIN.ts", head + "1,2,3:a\n:b\n")
  with pytest.raises(readers.DataError, match=r"X_TRAIN.ts:5: zero-length"):
    readers.read_ts(path)
  path = _write(tmp_path, "Y_TRAIN.ts", head + "1,zz,3:a\n")
  with pytest.raises(readers.DataError, match=r"Y_TRAIN.ts:4: malformed value"):
    readers.read_ts(path)
  path = _write(tmp_path, "Z_TRAIN.ts", head + "1,2:c\n")
  with pytest.raises(readers.DataError, match=r"Z_TRAIN.ts:4: label 'c' not in label set"):
    readers.read_ts(path)


def test_idx_size_mismatch_is_an_error(tmp_path):
  path = tmp_path / "train-images-idx3-ubyte.gz"
  header = bytes([0, 0, 8, 3]) + np.array([2, 3, 3], ">u4").tobytes()
  path.write_bytes(gzip.compress(header + bytes(10)))
  with pytest.raises(readers.DataError, match="header says shape"):
    readers.read_idx(path)


def test_documents_split_on_blank_lines_with_origin(tmp_path):
  path = _write(tmp_path, "a.txt", "Hello\nworld\n\n\nSecond  para\n")
  docs = list(readers.read_documents(path))
  assert [d["text"] for d in docs] == ["Hello world", "Second  para"]
  assert [d["origin"].rsplit(":", 1)[1] for d in docs] == ["1", "5"]


def test_split_names_come_from_file_names():
  assert readers.split_of("GunPoint_TRAIN.ts") == "train"
  assert readers.split_of("t10k-images-idx3-ubyte.gz") == "test"
  assert readers.split_of("dev.tsv") == "validation"
  assert readers.split_of("corpus.csv") == "train"


def test_missing_source_names_the_fetch_command(tmp_path):
  with pytest.raises(readers.DataError,
                     match=r"python -m jaxencoder.data fetch shakespeare --data-dir"):
    fetch.require("shakespeare", tmp_path)


@pytest.mark.parametrize("read", [readers.read_classification, readers.read_records])
def test_a_header_that_names_a_column_twice_is_refused_naming_it_and_its_columns(tmp_path, read):
  path = _write(tmp_path, "train.csv", "text,label,label\ngood,pos,neg\n")
  with pytest.raises(readers.DataError) as error:
    list(read(path))
  assert str(error.value) == (f"{path}:1: header 'text,label,label' names column 'label' 2 "
                              "times (columns 2, 3): give each column its own name")


def test_unnamed_columns_pass_and_a_name_three_times_lists_every_column():
  readers.check_distinct("f.csv", 1, ["text", "label", "", ""])  # unnamed: not a name twice
  with pytest.raises(readers.DataError, match=r"^f.csv:1: .* names column 'a' 3 times "
                                              r"\(columns 1, 3, 4\)"):
    readers.check_distinct("f.csv", 1, ["a", "b", "a", "a"])
