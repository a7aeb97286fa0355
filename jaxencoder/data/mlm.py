"""BERT masked-language-model corruption of one token sequence (pure numpy)."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class MaskSpec:
  """What to corrupt. Of the chosen tokens, `mask_frac` → [MASK], `random_frac` → random."""
  vocab_size: int
  mask_id: int
  special_ids: tuple[int, ...]
  rate: float = 0.15
  mask_frac: float = 0.8
  random_frac: float = 0.1
  whole_word: bool = False


def _choose(candidates_N, groups_N, n_pick, rng) -> np.ndarray:
  """Positions to corrupt: `n_pick` tokens, or whole groups (words) until ≥ n_pick tokens."""
  if groups_N is None:
    return rng.choice(candidates_N, size=n_pick, replace=False)
  words = np.unique(groups_N)
  picked, total = [], 0
  for w in rng.permutation(words):
    if total >= n_pick:
      break
    members = candidates_N[groups_N == w]
    picked.append(members)
    total += len(members)
  return np.concatenate(picked) if picked else np.zeros(0, np.int64)


def mask_tokens(input_ids_L: np.ndarray, spec: MaskSpec, rng: np.random.Generator,
                word_ids_L: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Corrupts round(rate · n) of the n non-special tokens (pads are special).

  Returns `input_ids` (corrupted), `mlm_labels` (the original ids) and
  `mlm_weights` (1.0 where a token was chosen, else 0.0), all [L]. With
  `spec.whole_word`, all sub-words of a chosen word (same `word_ids_L`) go together.
  """
  ids_L = np.asarray(input_ids_L, np.int32)
  is_special_L = np.isin(ids_L, np.asarray(spec.special_ids, np.int32))
  candidates_N = np.flatnonzero(~is_special_L)
  n_pick = int(round(spec.rate * len(candidates_N)))
  if len(candidates_N) and spec.rate > 0:
    n_pick = max(n_pick, 1)
  groups_N = None
  if spec.whole_word:
    if word_ids_L is None:
      raise ValueError("whole-word masking needs word_ids")
    groups_N = np.asarray(word_ids_L)[candidates_N]
  chosen = _choose(candidates_N, groups_N, n_pick, rng)

  out_L = ids_L.copy()
  action = rng.random(len(chosen))  # < mask_frac: [MASK]; next random_frac: random; else keep
  to_mask = chosen[action < spec.mask_frac]
  to_random = chosen[(action >= spec.mask_frac) & (action < spec.mask_frac + spec.random_frac)]
  out_L[to_mask] = spec.mask_id
  out_L[to_random] = _random_tokens(len(to_random), spec, rng)
  weights_L = np.zeros(ids_L.shape, np.float32)
  weights_L[chosen] = 1.0
  return {"input_ids": out_L, "mlm_labels": ids_L, "mlm_weights": weights_L}


def _random_tokens(n: int, spec: MaskSpec, rng) -> np.ndarray:
  """n ids drawn uniformly from the non-special vocabulary."""
  specials = np.sort(np.asarray(spec.special_ids, np.int64))
  draw = rng.integers(0, spec.vocab_size - len(specials), size=n)
  for s in specials:  # shift past each special id: a bijection onto non-special ids
    draw = draw + (draw >= s)
  return draw.astype(np.int32)
