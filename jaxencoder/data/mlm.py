"""BERT masked-language-model corruption of whole batches of token rows (pure numpy).

Which tokens are chosen and what they become depend only on three uniform draws per
token. `mask_batch` takes them from `counter_uniforms`: a hash of (seed, stream, example
index, position), so a row's mask is the same whatever batch, process or worker holds it,
and a resumed pipeline re-draws exactly the same masks. `mask_tokens` does one row from a
numpy Generator.

The rate enters last: `mask_plan` ranks each row's candidates and says what each token
becomes if chosen (no rate), `apply_rate` picks the round(rate · n) first; `mask_batch` is
the two. A rate that changes during training (`scheduled_rate`, data.mask_rate_schedule)
is applied to plans where the batch's index is known (data/pipeline.mlm_pipeline).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

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


# Streams of uniform draws: which tokens (or words) are chosen, what each becomes, the
# random replacement id.
CHOOSE, ACTION, REPLACEMENT = 0, 1, 2
Uniforms = Callable[[int], np.ndarray]  # stream -> [B, L] floats in [0, 1)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
  """splitmix64's finaliser: a bijection of uint64 that scatters nearby inputs."""
  x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
  x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
  return x ^ (x >> np.uint64(31))


def counter_uniforms(seed: int, example_index_B: np.ndarray, length: int) -> Uniforms:
  """Draws for rows whose global example indices are `example_index_B`: stream s gives
  [B, length] floats in [0, 1), a pure function of (seed, s, example index, position)."""
  rows = np.asarray(example_index_B, np.uint64)[:, None]
  cols = np.arange(length, dtype=np.uint64)[None, :]
  def draw(stream: int) -> np.ndarray:
    with np.errstate(over="ignore"):
      key = _mix64(np.uint64(seed) * _GOLDEN + np.uint64(stream + 1))
      x = _mix64(_mix64(key ^ (rows * _GOLDEN)) + cols)
    return (x >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
  return draw


def mask_batch(input_ids_BxL: np.ndarray, spec: MaskSpec, uniforms: Uniforms,
               word_ids_BxL: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Corrupts round(rate · n) of each row's n non-special tokens (at least 1; pads are
  special), chosen uniformly; with `spec.whole_word`, whole words (all sub-words with one
  `word_ids_BxL` value) in random order until that many tokens are chosen.

  Returns `input_ids` (corrupted), `mlm_labels` (the original ids) and `mlm_weights`
  (1.0 where a token was chosen, else 0.0), all [B, L].
  """
  return apply_rate(mask_plan(input_ids_BxL, spec, uniforms, word_ids_BxL), spec.rate)


# What `mask_plan` adds to a batch (and `apply_rate` consumes), all [B, L] int32: the id a
# token becomes if chosen, its rank among its row's candidates (whole words: the rank of
# the word's first token; non-candidates: L), and its row's number of candidates.
PLAN_KEYS = ("mlm_swap_ids", "mlm_rank", "mlm_candidates")


def mask_plan(input_ids_BxL: np.ndarray, spec: MaskSpec, uniforms: Uniforms,
              word_ids_BxL: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """Everything `mask_batch` decides but the rate (`spec.rate` is not read): `input_ids`
  and `mlm_labels` (both the original ids) and PLAN_KEYS. Rows may be packed after (each
  token carries its own row's facts); `apply_rate` finishes them."""
  ids_BxL = np.asarray(input_ids_BxL, np.int32)
  b, length = ids_BxL.shape
  candidate_BxL = ~np.isin(ids_BxL, np.asarray(spec.special_ids, np.int32))
  n_candidates_B = candidate_BxL.sum(axis=1)

  score_BxL = uniforms(CHOOSE)
  if spec.whole_word:
    if word_ids_BxL is None:
      raise ValueError("whole-word masking needs word_ids")
    # Every sub-word of word w takes draw w: a word's tokens share one score.
    words_BxL = np.clip(np.asarray(word_ids_BxL), 0, length - 1)
    score_BxL = np.take_along_axis(score_BxL, words_BxL, axis=1)
  score_BxL = np.where(candidate_BxL, score_BxL, np.inf)
  order_BxL = np.argsort(score_BxL, axis=1, kind="stable")
  sorted_BxL = np.take_along_axis(score_BxL, order_BxL, axis=1)
  # A group (word, or token) is taken when fewer than n_pick tokens come before it.
  starts = np.ones((b, length), bool)
  starts[:, 1:] = sorted_BxL[:, 1:] != sorted_BxL[:, :-1]
  group_start_BxL = np.maximum.accumulate(np.where(starts, np.arange(length), 0), axis=1)
  rank_BxL = np.full((b, length), length, np.int32)
  np.put_along_axis(rank_BxL, order_BxL,
                    np.where(np.isfinite(sorted_BxL), group_start_BxL, length), axis=1)

  action_BxL = uniforms(ACTION)  # < mask_frac: [MASK]; next random_frac: random; else kept
  to_mask = action_BxL < spec.mask_frac
  to_random = ~to_mask & (action_BxL < spec.mask_frac + spec.random_frac)
  swap_BxL = np.where(to_mask, np.int32(spec.mask_id), ids_BxL)
  swap_BxL = np.where(to_random, _random_tokens(uniforms(REPLACEMENT), spec), swap_BxL)
  n_BxL = np.repeat(n_candidates_B.astype(np.int32)[:, None], length, axis=1)
  return {"input_ids": ids_BxL, "mlm_labels": ids_BxL, "mlm_swap_ids": swap_BxL.astype(np.int32),
          "mlm_rank": rank_BxL, "mlm_candidates": n_BxL}


def apply_rate(plan: dict[str, np.ndarray], rate: float) -> dict[str, np.ndarray]:
  """A `mask_plan` batch (rows possibly packed) masked at `rate`: in each sequence of n
  candidates, the round(rate · n) first-ranked (at least 1 when rate > 0) become their
  `mlm_swap_ids`; `mlm_weights` marks them. PLAN_KEYS are dropped, other keys kept."""
  n_BxL = plan["mlm_candidates"]
  n_pick_BxL = np.minimum(np.round(rate * n_BxL).astype(np.int64), n_BxL)
  if rate > 0:
    n_pick_BxL = np.where(n_BxL > 0, np.maximum(n_pick_BxL, 1), 0)
  chosen_BxL = plan["mlm_rank"] < n_pick_BxL
  out = {k: v for k, v in plan.items() if k not in PLAN_KEYS}
  out["input_ids"] = np.where(chosen_BxL, plan["mlm_swap_ids"], plan["input_ids"]
                              ).astype(np.int32)
  out["mlm_weights"] = chosen_BxL.astype(np.float32)
  return out


def scheduled_rate(schedule, index: int, rate: float) -> float:
  """The rate of the last (start, rate) point of `schedule` (starts increasing) with
  start <= `index`; `rate` before the first point (piecewise constant)."""
  for start, point_rate in schedule:
    if start > index:
      break
    rate = point_rate
  return float(rate)


def mask_tokens(input_ids_L: np.ndarray, spec: MaskSpec, rng: np.random.Generator,
                word_ids_L: np.ndarray | None = None) -> dict[str, np.ndarray]:
  """`mask_batch` of one row [L], its draws from `rng`."""
  ids_1xL = np.asarray(input_ids_L, np.int32)[None]
  draws = [rng.random(ids_1xL.shape) for _ in range(3)]
  words = None if word_ids_L is None else np.asarray(word_ids_L)[None]
  out = mask_batch(ids_1xL, spec, lambda stream: draws[stream], words)
  return {k: v[0] for k, v in out.items()}


def _random_tokens(uniform: np.ndarray, spec: MaskSpec) -> np.ndarray:
  """Ids drawn uniformly from the non-special vocabulary, one per uniform."""
  specials = np.sort(np.asarray(spec.special_ids, np.int64))
  draw = np.minimum((uniform * (spec.vocab_size - len(specials))).astype(np.int64),
                    spec.vocab_size - len(specials) - 1)
  for s in specials:  # shift past each special id: a bijection onto non-special ids
    draw = draw + (draw >= s)
  return draw.astype(np.int32)
