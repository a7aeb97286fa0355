"""Position information against hand-computed values: T5's relative buckets, the per-head
relative bias, 2-D sinusoids for patch grids. (1-D sinusoids, RoPE and packed positions
are specified in test_attention.py, next to the attention they feed.)"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from jaxencoder.positions import RelativePositionBias, relative_bucket, sinusoidal_2d

# T5 (num_buckets=32, max_distance=128): 16 buckets per direction, keys after the query
# (offset = key - query > 0) in 16..31; offsets below 8 exact, then
# 8 + floor(log(|offset| / 8) / log(128 / 8) * 8), capped at 15.
T5_BUCKETS = {
    0: 0, -1: 1, -7: 7, -8: 8, -12: 9, -20: 10, -30: 11, -45: 12, -50: 13, -90: 14,
    -100: 15, -127: 15, -128: 15, -1000: 15,
    1: 17, 7: 23, 8: 24, 12: 25, 20: 26, 50: 29, 100: 31, 1000: 31,
}
# num_buckets=8, max_distance=20: 4 per direction, exact below 2, then
# 2 + floor(log(|offset| / 2) / log(10) * 2), capped at 3.
SMALL_BUCKETS = {0: 0, -1: 1, -2: 2, -3: 2, -4: 2, -5: 2, -6: 2, -7: 3, -100: 3,
                 1: 5, 2: 6, 3: 6, 4: 6, 5: 6, 6: 6, 7: 7, 100: 7}


@pytest.mark.parametrize("num_buckets, max_distance, expected", [
    (32, 128, T5_BUCKETS), (8, 20, SMALL_BUCKETS)], ids=["t5", "small"])
def test_relative_buckets_match_hand_computed_t5_values(num_buckets, max_distance, expected):
  offsets = jnp.array(list(expected))
  got = relative_bucket(offsets, num_buckets, max_distance)
  assert dict(zip(expected, np.asarray(got).tolist())) == expected
  jitted = jax.jit(relative_bucket, static_argnums=(1, 2))(offsets, num_buckets, max_distance)
  np.testing.assert_array_equal(jitted, got)


def test_relative_bias_reads_the_table_at_each_key_query_bucket():
  """bias[b, h, i, j] = table[bucket(pos_j - pos_i), h], for packed (restarting) positions."""
  cfg = tiny_config(position_embedding="relative", relative_num_buckets=8,
                    relative_max_distance=20)
  positions = jnp.array([[0, 1, 2, 3, 4, 5, 6, 7], [0, 1, 2, 0, 1, 2, 3, 4]])
  table = np.arange(8 * 4, dtype=np.float32).reshape(8, 4) * 10  # [buckets, heads]
  bias = RelativePositionBias(cfg).apply({"params": {"embedding": table}}, positions)
  assert bias.shape == (2, 4, 8, 8)  # [B, H, L, L]
  expected = np.zeros((2, 4, 8, 8), np.float32)
  for b in range(2):
    for i in range(8):
      for j in range(8):
        offset = int(positions[b, j] - positions[b, i])
        expected[b, :, i, j] = table[SMALL_BUCKETS[offset]]
  np.testing.assert_array_equal(bias, expected)
  assert bias[0, 2, 0, 7] == table[7, 2] and bias[0, 2, 7, 0] == table[3, 2]


def test_relative_bias_table_is_one_per_model_with_heads_named():
  cfg = tiny_config(position_embedding="relative")
  variables = RelativePositionBias(cfg).init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32))
  box = variables["params"]["embedding"]
  assert isinstance(box, nn.Partitioned) and box.names == (None, "heads")
  assert box.value.shape == (cfg.relative_num_buckets, cfg.num_heads)


def test_2d_sinusoids_give_rows_then_columns_of_the_patch_grid():
  """dim 8 on a 2 x 3 grid, patches row-major: features 0-3 are sinusoids(row, 4) =
  [sin r, cos r, sin r/100, cos r/100] (10000^(2/4) = 100), features 4-7 the same of the column."""
  table = np.asarray(sinusoidal_2d(2, 3, 8))
  assert table.shape == (6, 8)
  def expected(r, c):
    return [np.sin(r), np.cos(r), np.sin(r / 100), np.cos(r / 100),
            np.sin(c), np.cos(c), np.sin(c / 100), np.cos(c / 100)]
  np.testing.assert_allclose(table[0], [0, 1, 0, 1, 0, 1, 0, 1], atol=1e-7)
  np.testing.assert_allclose(table[5], expected(1, 2), atol=1e-6)  # patch (row 1, col 2)
  np.testing.assert_allclose(table[1], expected(0, 1), atol=1e-6)
  np.testing.assert_allclose(table[3], expected(1, 0), atol=1e-6)
  for index in range(6):
    np.testing.assert_allclose(table[index], expected(*divmod(index, 3)), atol=1e-6)


def test_2d_sinusoids_need_an_even_width():
  with pytest.raises(ValueError, match="emb_dim=7 must be even"):
    sinusoidal_2d(2, 2, 7)
