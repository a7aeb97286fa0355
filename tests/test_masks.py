"""make_attention_mask against hand-written [L, L] matrices: padding, packed segments,
causal, sliding window, and all at once. (What the masks do to the encoder's outputs is
specified in test_attention.py.)"""

import jax.numpy as jnp
import numpy as np

from jaxencoder.model.masks import make_attention_mask


def rows(*lines: str) -> np.ndarray:
  """A [L, L] boolean matrix from strings of 1 / . (query rows, key columns)."""
  return np.array([[c == "1" for c in line] for line in lines])


def test_padding_hides_pad_keys_from_every_query():
  mask = make_attention_mask(jnp.array([[1, 1, 1, 0]]))
  assert mask.shape == (1, 1, 4, 4) and mask.dtype == jnp.bool_
  np.testing.assert_array_equal(mask[0, 0], rows("111.", "111.", "111.", "111."))


def test_segments_keep_queries_in_their_own_sequence():
  mask = make_attention_mask(jnp.array([[1, 1, 1, 1, 1, 0]]),
                             jnp.array([[1, 1, 2, 2, 2, 0]]))
  np.testing.assert_array_equal(mask[0, 0], rows("11....", "11....", "..111.", "..111.",
                                                 "..111.", "......"))


def test_causal_hides_the_future():
  mask = make_attention_mask(jnp.ones((1, 4), jnp.int32), causal=True)
  np.testing.assert_array_equal(mask[0, 0], rows("1...", "11..", "111.", "1111"))


def test_sliding_window_keeps_offsets_up_to_w_both_ways():
  mask = make_attention_mask(jnp.ones((1, 5), jnp.int32), sliding_window=1)
  np.testing.assert_array_equal(mask[0, 0], rows("11...", "111..", ".111.", "..111", "...11"))
  zero = make_attention_mask(jnp.ones((1, 3), jnp.int32), sliding_window=0)
  np.testing.assert_array_equal(zero[0, 0], np.eye(3, dtype=bool))


def test_all_conditions_combine_per_batch_row():
  mask = make_attention_mask(jnp.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]),
                             jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]]),
                             causal=True, sliding_window=1)
  np.testing.assert_array_equal(mask[0, 0], rows("1.....", "11....", ".11...", "...1..",
                                                 "...11.", "......"))
  np.testing.assert_array_equal(mask[1, 0], rows("1.....", "11....", ".11...", "..11..",
                                                 "...11.", "....11"))
