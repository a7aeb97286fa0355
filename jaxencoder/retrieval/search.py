"""Exact top-k inner-product search on device, in blocks.

The corpus vectors [N, D] go to the device once, as [N / C, C, D] blocks of C rows; for
each chunk of Q queries a `lax.scan` over the blocks keeps a running top k: the block's
scores [Q, C] (float32 at full precision) are merged with the k kept so far by
`lax.top_k`. Peak memory is the corpus vectors plus Q x (k + C) scores, whatever N is;
the result is the exact top k (ties: the lower corpus index first, as a stable sort).

Candidates can be left out per query: given ids (`exclude_QxE`, -1 for none) and any
scoring above a ceiling (`max_score_Q`); too few left gives id -1 and score -inf.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

BLOCK = 4096  # corpus rows scored at once
QUERY_BLOCK = 1024  # queries searched at once


def top_k(queries_QxD, corpus_NxD, k: int, *, exclude_QxE=None, max_score_Q=None,
          block: int = BLOCK, query_block: int = QUERY_BLOCK) -> tuple[np.ndarray, np.ndarray]:
  """(scores [Q, k] float32, corpus ids [Q, k] int32), best first, of each query's k
  highest inner products with the corpus (k at most N)."""
  queries_QxD = np.asarray(queries_QxD, np.float32)
  corpus_NxD = np.asarray(corpus_NxD, np.float32)
  (q, dim), n = queries_QxD.shape, len(corpus_NxD)
  if corpus_NxD.ndim != 2 or corpus_NxD.shape[1] != dim or not n:
    raise ValueError(f"corpus {corpus_NxD.shape} and queries {queries_QxD.shape}: needs "
                     "[N, D] and [Q, D] vectors of one width D, N > 0")
  k, block = min(k, n), min(block, n)
  blocks_NbxCxD = jnp.asarray(_padded(corpus_NxD, -(-n // block) * block).reshape(-1, block, dim))
  exclude_QxE = (np.full((q, 1), -1) if exclude_QxE is None else np.asarray(exclude_QxE)
                 ).astype(np.int32).reshape(q, -1)
  max_score_Q = (np.full(q, np.inf) if max_score_Q is None else np.asarray(max_score_Q)
                 ).astype(np.float32)
  rows = max(1, min(query_block, q))
  scores_QxK, ids_QxK = np.zeros((q, k), np.float32), np.zeros((q, k), np.int32)
  for start in range(0, q, rows):
    part = slice(start, start + rows)
    got = _search(_padded(queries_QxD[part], rows), blocks_NbxCxD, np.int32(n),
                  _padded(exclude_QxE[part], rows), _padded(max_score_Q[part], rows), k=k)
    size = len(queries_QxD[part])
    scores_QxK[part], ids_QxK[part] = (np.asarray(x)[:size] for x in got)
  return scores_QxK, ids_QxK


def _padded(x: np.ndarray, rows: int) -> np.ndarray:
  """`x` with zero rows added up to `rows` (one compile for every chunk)."""
  return np.pad(x, ((0, rows - len(x)),) + ((0, 0),) * (x.ndim - 1))


@functools.partial(jax.jit, static_argnames="k")
def _search(q_QxD, blocks_NbxCxD, n, exclude_QxE, max_score_Q, *, k: int):
  num_blocks, c, _ = blocks_NbxCxD.shape
  rows = q_QxD.shape[0]

  def merge(kept, block):
    (scores_QxK, ids_QxK), (c_CxD, start) = kept, block
    s_QxC = jnp.matmul(q_QxD, c_CxD.T, precision=jax.lax.Precision.HIGHEST)
    ids_C = start + jnp.arange(c, dtype=jnp.int32)
    dropped_QxC = ((ids_C >= n)[None, :]
                   | jnp.any(ids_C[None, :, None] == exclude_QxE[:, None, :], -1)
                   | (s_QxC > max_score_Q[:, None]))
    s_QxC = jnp.where(dropped_QxC, -jnp.inf, s_QxC)
    both_scores = jnp.concatenate([scores_QxK, s_QxC], 1)  # kept first: ties keep lower ids
    both_ids = jnp.concatenate([ids_QxK, jnp.broadcast_to(ids_C, (rows, c))], 1)
    top_QxK, at_QxK = jax.lax.top_k(both_scores, k)
    return (top_QxK, jnp.take_along_axis(both_ids, at_QxK, 1)), None

  start = (jnp.full((rows, k), -jnp.inf, jnp.float32), jnp.full((rows, k), -1, jnp.int32))
  starts = jnp.arange(num_blocks, dtype=jnp.int32) * c
  (scores_QxK, ids_QxK), _ = jax.lax.scan(merge, start, (blocks_NbxCxD, starts))
  return scores_QxK, jnp.where(scores_QxK == -jnp.inf, -1, ids_QxK)
