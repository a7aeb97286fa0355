"""Position information against hand-computed values: T5's relative buckets, the per-head
relative bias, 2-D sinusoids for patch grids. (1-D sinusoids, RoPE and packed positions
are specified in test_attention.py, next to the attention they feed.)"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from conftest import tiny_config
from jaxencoder import Encoder
from jaxencoder.model.config import EncoderConfig
from jaxencoder.model.positions import (RelativePositionBias, apply_rope, relative_bucket,
                                  resample_position_grid, resample_position_table, sinusoidal_2d)

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


# ------------------------------------------------------------------ resampling tables
def test_bilinear_2x2_grid_to_4x4_matches_hand_computed_values():
  """Half-pixel centres: output row i reads src (i + 0.5) / 2 - 0.5 = -0.25 (clamped to 0),
  0.25, 0.75, 1.25 (past the last row: row 1), so each axis weighs the two old rows
  [1, 0], [.75, .25], [.25, .75], [0, 1]. Grid [[0, 1], [2, 3]], [CLS] row 9 kept."""
  table_5x1 = np.array([[9.0], [0.0], [1.0], [2.0], [3.0]], np.float32)
  out = np.asarray(resample_position_grid(table_5x1, (2, 2), (4, 4), "bilinear"))
  expected = [[0.0, 0.25, 0.75, 1.0],
              [0.5, 0.75, 1.25, 1.5],
              [1.5, 1.75, 2.25, 2.5],
              [2.0, 2.25, 2.75, 3.0]]
  assert out.shape == (17, 1) and out[0, 0] == 9.0
  np.testing.assert_allclose(out[1:, 0].reshape(4, 4), expected, atol=1e-6)


def test_bicubic_row_matches_hand_computed_keys_a_minus_0_75_weights():
  """[0, 1] -> 4 samples at src -0.25, 0.25, 0.75, 1.25. At src 0.25 (t = 0.25) the taps
  -1, 0, 1, 2 (clamped to 0, 0, 1, 1) weigh -0.10546875, 0.87890625, 0.26171875,
  -0.03515625, so out[1] = 0.26171875 - 0.03515625; at src -0.25 only the last tap reads
  the 1: out[0] = -0.10546875 (an overshoot, as torch's). The rest by symmetry."""
  table_2x1 = np.array([[0.0], [1.0]], np.float32)
  out = np.asarray(resample_position_grid(table_2x1, (1, 2), (1, 4), "bicubic"))[:, 0]
  np.testing.assert_allclose(out, [-0.10546875, 0.2265625, 0.7734375, 1.10546875], atol=1e-7)


def test_grid_resample_keeps_rank_and_is_the_identity_at_the_same_size():
  table_1xTxD = jax.random.normal(jax.random.key(0), (1, 1 + 6, 3))
  same = resample_position_grid(table_1xTxD, (2, 3), (2, 3))
  np.testing.assert_allclose(same, table_1xTxD, atol=1e-6)
  assert resample_position_grid(table_1xTxD, (2, 3), (4, 5)).shape == (1, 1 + 20, 3)
  with pytest.raises(ValueError, match="a 3x3 grid needs 9"):
    resample_position_grid(table_1xTxD, (3, 3), (4, 4))
  with pytest.raises(ValueError, match="method='nearest'"):
    resample_position_grid(table_1xTxD, (2, 3), (4, 4), "nearest")


def test_linear_table_extension_keeps_the_ends_and_interpolates_between():
  """3 rows [0, 10, 20] -> 5: src i * 2/4 = 0, .5, 1, 1.5, 2; -> 4: src i * 2/3."""
  table_3x2 = np.array([[0.0, 1.0], [10.0, 1.0], [20.0, 1.0]], np.float32)
  np.testing.assert_allclose(resample_position_table(table_3x2, 5)[:, 0],
                             [0, 5, 10, 15, 20], atol=1e-5)
  np.testing.assert_allclose(resample_position_table(table_3x2, 4)[:, 0],
                             [0, 20 / 3, 40 / 3, 20], atol=1e-5)
  np.testing.assert_allclose(resample_position_table(table_3x2, 5)[:, 1], 1.0, atol=1e-6)


def test_rope_scaling_2_at_position_2_equals_scaling_1_at_position_1():
  x_BxLxHxK = jax.random.normal(jax.random.key(0), (1, 3, 2, 8))
  at_2_4_6 = apply_rope(x_BxLxHxK, jnp.array([[2, 4, 6]]), 10_000.0, scaling=2.0)
  at_1_2_3 = apply_rope(x_BxLxHxK, jnp.array([[1, 2, 3]]), 10_000.0)
  np.testing.assert_allclose(at_2_4_6, at_1_2_3, atol=1e-6)
  positions = jnp.array([[0, 5, 9]])
  np.testing.assert_array_equal(apply_rope(x_BxLxHxK, positions, 1e4, 1.0),
                                apply_rope(x_BxLxHxK, positions, 1e4))


def test_encoder_rope_scaling_reads_positions_divided_by_the_factor():
  """The config field reaches attention: positions 2p with rope_scaling=2 give the outputs
  of positions p unscaled."""
  cfg = tiny_config(position_embedding="rope")
  ids_BxL = jnp.arange(1, 9, dtype=jnp.int32)[None]
  params = Encoder(cfg).init(jax.random.key(0), ids_BxL)["params"]
  positions_BxL = jnp.arange(8, dtype=jnp.int32)[None]
  plain = Encoder(cfg).apply({"params": params}, ids_BxL, positions=positions_BxL)
  scaled = Encoder(cfg.replace(rope_scaling=2.0)).apply({"params": params}, ids_BxL,
                                                        positions=2 * positions_BxL)
  np.testing.assert_allclose(scaled.last_hidden_state, plain.last_hidden_state, atol=1e-5)
  with pytest.raises(ValueError, match="rope_scaling must be positive"):
    EncoderConfig(rope_scaling=0.0)
