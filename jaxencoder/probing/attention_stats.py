"""Attention diagnostics per layer and head: entropy, where the weight goes, distance, sparsity.

Every statistic is computed per real query token over real key tokens only (padding
is excluded on both sides, and each query's row is renormalised over real keys), then
summed over queries so that batches of any size accumulate exactly:
`head_sums` runs inside jit, `head_means` turns the sums into means on the host.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

STATS = ("entropy", "cls", "sep", "punct", "distance", "sparsity")


def _real_rows(probs_BxHxLxL: jax.Array, key_mask_BxL: jax.Array) -> jax.Array:
  """Attention with padding keys zeroed and each row renormalised over real keys."""
  keys_Bx1x1xL = key_mask_BxL.astype(probs_BxHxLxL.dtype)[:, None, None, :]
  p_BxHxLxL = probs_BxHxLxL * keys_Bx1x1xL
  total_BxHxLx1 = p_BxHxLxL.sum(-1, keepdims=True)
  return p_BxHxLxL / jnp.where(total_BxHxLx1 > 0, total_BxHxLx1, 1.0)


def entropy(probs_BxHxLxL: jax.Array, key_mask_BxL: jax.Array) -> jax.Array:
  """[B, H, L] entropy (nats) of each query's attention over real keys."""
  p_BxHxLxL = _real_rows(probs_BxHxLxL, key_mask_BxL)
  return -jax.scipy.special.xlogy(p_BxHxLxL, p_BxHxLxL).sum(-1)


def mass_on(probs_BxHxLxL: jax.Array, key_mask_BxL: jax.Array,
            group_BxL: jax.Array) -> jax.Array:
  """[B, H, L] share of each query's attention that lands on keys in `group_BxL`."""
  p_BxHxLxL = _real_rows(probs_BxHxLxL, key_mask_BxL)
  return (p_BxHxLxL * group_BxL.astype(p_BxHxLxL.dtype)[:, None, None, :]).sum(-1)


def mean_distance(probs_BxHxLxL: jax.Array, key_mask_BxL: jax.Array) -> jax.Array:
  """[B, H, L] expected |i - j| (in tokens) between query i and its attended key j."""
  p_BxHxLxL = _real_rows(probs_BxHxLxL, key_mask_BxL)
  pos_L = jnp.arange(p_BxHxLxL.shape[-1])
  dist_1x1xLxL = jnp.abs(pos_L[:, None] - pos_L[None, :]).astype(p_BxHxLxL.dtype)[None, None]
  return (p_BxHxLxL * dist_1x1xLxL).sum(-1)


def sparsity(probs_BxHxLxL: jax.Array, key_mask_BxL: jax.Array,
             threshold: float) -> jax.Array:
  """[B, H, L] share of each query's attention carried by weights >= `threshold`."""
  p_BxHxLxL = _real_rows(probs_BxHxLxL, key_mask_BxL)
  return jnp.where(p_BxHxLxL >= threshold, p_BxHxLxL, 0.0).sum(-1)


def head_sums(probs_BxHxLxL: jax.Array, key_mask_BxL: jax.Array,
              groups: Mapping[str, jax.Array], threshold: float) -> dict[str, jax.Array]:
  """Per-head sums over real queries of every statistic in STATS ([H] each), + "queries".

  `groups` holds the [B, L] boolean masks "cls", "sep" and "punct".
  """
  per_query = {
      "entropy": entropy(probs_BxHxLxL, key_mask_BxL),
      "distance": mean_distance(probs_BxHxLxL, key_mask_BxL),
      "sparsity": sparsity(probs_BxHxLxL, key_mask_BxL, threshold),
  }
  for name in ("cls", "sep", "punct"):
    per_query[name] = mass_on(probs_BxHxLxL, key_mask_BxL, groups[name])
  queries_Bx1xL = key_mask_BxL.astype(probs_BxHxLxL.dtype)[:, None, :]
  sums = {k: (v * queries_Bx1xL).sum((0, 2)) for k, v in per_query.items()}
  sums["queries"] = queries_Bx1xL.sum()
  return sums


def head_means(sums: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Means per layer and head ([N, H] each) from accumulated `head_sums` ([N, H])."""
  count = max(float(np.asarray(sums["queries"]).reshape(-1)[0]), 1.0)
  return {k: np.asarray(sums[k], np.float64) / count for k in STATS}


def punctuation_table(tokenizer) -> np.ndarray:
  """Bool [V]: token id -> whether the token is punctuation only (e.g. `,` `.` `##.`)."""
  table = np.zeros(tokenizer.vocab_size, bool)
  for token, i in tokenizer.hf.get_vocab().items():
    text = token[2:] if token.startswith("##") else token.removeprefix("Ġ")  # byte-level BPE
    is_special = text.startswith("[") and text.endswith("]") and len(text) > 2
    if text and not is_special and all(unicodedata.category(c).startswith("P") for c in text):
      table[i] = True
  return table


def token_groups(input_ids_BxL: np.ndarray, tokenizer, punct_V: np.ndarray
                 ) -> dict[str, np.ndarray]:
  """[B, L] masks of [CLS], [SEP] and punctuation tokens, for `head_sums`."""
  return {"cls": input_ids_BxL == tokenizer.cls_id, "sep": input_ids_BxL == tokenizer.sep_id,
          "punct": punct_V[input_ids_BxL]}
