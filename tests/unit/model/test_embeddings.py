"""Position encodings: the paper's sinusoids, rotary positions, T5's relative buckets; the
dtypes a program computes in."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from transformer_jax.model.embeddings import (
  ROTARY_BASE,
  activation_dtype,
  relative_position_bucket,
  rotary,
  sinusoidal_positions,
)
from transformer_jax.ops.platform import tracing_for


def test_sinusoidal_positions_match_the_paper_formula():
  table = sinusoidal_positions(10, 8)
  for pos in range(10):
    for i in range(4):
      angle = pos / 10000 ** (2 * i / 8)
      assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
      assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)


def test_rotary_query_key_products_depend_only_on_the_offset():
  """Shifting every position by the same amount leaves the attention logits unchanged; other
  offsets change them."""
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(1, 6, 2, 8)), jnp.float32)
  k = jnp.asarray(rng.normal(size=(1, 6, 2, 8)), jnp.float32)
  positions = jnp.arange(6)[None]

  def logits(q_positions, k_positions):
    return jnp.einsum("bthk,bshk->bhts", rotary(q, q_positions, 128),
                      rotary(k, k_positions, 128))

  base = logits(positions, positions)
  for shift in (1, 7, 100):
    np.testing.assert_allclose(logits(positions + shift, positions + shift), base, atol=1e-4)
  assert not np.allclose(logits(positions, positions + 1), base, atol=1e-2)
  # A rotation: norms are kept, and position 0 is the identity.
  np.testing.assert_allclose(np.linalg.norm(rotary(q, positions, 128), axis=-1),
                             np.linalg.norm(q, axis=-1), rtol=1e-5)
  np.testing.assert_allclose(rotary(q, 0 * positions, 128), q)


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_rotary_on_cpu_reads_the_bits_a_program_computes_and_nan_past_the_table(platform):
  """On CPUs the table holds what sin and cos computed inside a jitted program give (reading
  it changes no output), for a decoding step's single position as for a sequence, and a
  position past the table is NaN, not a clamped angle; elsewhere they are computed."""
  q = jnp.asarray(np.random.default_rng(0).normal(size=(3, 40, 2, 16)), jnp.float32)

  @jax.jit
  def computed(x_BTHK, positions_BT):
    inverse_wavelengths = ROTARY_BASE ** (-jnp.arange(8, dtype=jnp.float32) / 8)
    angles_BT1K = (positions_BT[..., None] * inverse_wavelengths)[:, :, None]
    a, b = x_BTHK[..., :8], x_BTHK[..., 8:]
    sin, cos = jnp.sin(angles_BT1K), jnp.cos(angles_BT1K)
    return jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)

  with tracing_for(platform):
    looked_up = jax.jit(lambda x, positions: rotary(x, positions, 128))  # (traced anew)
    sequence = jnp.broadcast_to(jnp.arange(40) * 3, (3, 40))
    np.testing.assert_array_equal(looked_up(q, sequence), computed(q, sequence))
    for position in (0, 5, 127):
      step = jnp.full((3, 1), position)
      np.testing.assert_array_equal(looked_up(q[:, :1], step), computed(q[:, :1], step))
    past = jnp.full((3, 1), 128)
    if platform == "cpu":
      assert np.isnan(looked_up(q[:, :1], past)).all()
    else:
      np.testing.assert_array_equal(looked_up(q[:, :1], past), computed(q[:, :1], past))


def _t5_bucket(offset: int, bidirectional: bool, num_buckets: int = 32,
               max_distance: int = 128) -> int:
  """T5's _relative_position_bucket (mesh_tensorflow), for one key-minus-query offset."""
  bucket, n = 0, -offset
  if bidirectional:
    num_buckets //= 2
    bucket += num_buckets if n < 0 else 0
    n = abs(n)
  else:
    n = max(n, 0)
  max_exact = num_buckets // 2
  if n < max_exact:
    return bucket + n
  large = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                          * (num_buckets - max_exact))
  return bucket + min(large, num_buckets - 1)


def test_relative_position_buckets_equal_t5s_formula():
  offsets = np.array([0, 1, -1, 2, -2, 7, -7, 8, -8, 15, -15, 16, -16, 31, -31, 64, -64,
                      127, -127, 128, -128, 500, -500])
  for bidirectional in (True, False):
    got = relative_position_bucket(jnp.asarray(offsets), bidirectional, 32, 128)
    assert list(np.asarray(got)) == [_t5_bucket(int(o), bidirectional) for o in offsets]
  # A few by hand: keys just before/after the query, and far away, each direction.
  both = relative_position_bucket(jnp.asarray([0, -1, 1, -500, 500]), True, 32, 128)
  assert list(np.asarray(both)) == [0, 1, 17, 15, 31]
  causal = relative_position_bucket(jnp.asarray([3, -3, -500]), False, 32, 128)
  assert list(np.asarray(causal)) == [0, 3, 31]


def test_auto_activations_are_bf16_only_in_programs_traced_for_gpus():
  bf16 = helpers.section("model", dtype="bfloat16", activation_dtype="auto")
  assert activation_dtype(bf16) is None  # (this process's backend: the CPU, as before)
  for platform, expected in (("gpu", jnp.bfloat16), ("tpu", None), ("cpu", None)):
    with tracing_for(platform):
      assert activation_dtype(bf16) == expected, platform
  with tracing_for("gpu"):  # (bf16 between matmuls only with bf16 matmuls)
    assert activation_dtype(helpers.section("model", dtype="float32",
                                            activation_dtype="auto")) is None
    assert activation_dtype(helpers.section("model", dtype="bfloat16",
                                            activation_dtype="float32")) is None
