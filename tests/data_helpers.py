"""Small shared fixtures for the data tests: a tiny vocab and tiny corpora."""

import fcntl
import json

import numpy as np

from jaxencoder.tokenizer import Tokenizer

WORDS = ("the cat sat on a mat dog ran far away time flies like an arrow fruit banana "
         "quick brown fox jumps over lazy").split()
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "##s", "##ing"] + WORDS


def tiny_tokenizer() -> Tokenizer:
  return Tokenizer.from_vocab(VOCAB)


def sentences(n: int, seed: int = 0) -> list[dict]:
  """n texts of 1..12 random vocab words, as a list-backed source."""
  rng = np.random.default_rng(seed)
  return [{"text": " ".join(rng.choice(WORDS, size=rng.integers(1, 13))).encode(),
           "origin": f"mem:{i}".encode()} for i in range(n)]


def built_once(tmp_path_factory, worker_id, name: str, build):
  """(root, build(root)): `build` (a folder -> a JSON-able record) runs once per test
  session; xdist workers share its folder and record through a file lock (the first
  builds, the others read)."""
  base = tmp_path_factory.getbasetemp()
  root = (base if worker_id == "master" else base.parent) / name
  with open(f"{root}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    done = root.parent / f"{name}.json"
    if not done.exists():
      done.write_text(json.dumps(build(root)))
    return root, json.loads(done.read_text())


def assert_batches_equal(a, b):
  """Two lists of batches (dicts of arrays) are equal, key by key."""
  assert len(a) == len(b)
  for k, (x, y) in enumerate(zip(a, b)):
    assert x.keys() == y.keys()
    for key in x:
      np.testing.assert_array_equal(x[key], y[key], err_msg=f"batch {k}, {key}")
