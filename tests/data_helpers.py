"""Small shared fixtures for the data tests: a tiny vocab and tiny corpora."""

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
