"""The blockwise top-k against jax.lax.top_k."""

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.ops.masking import NEG_INF
from transformer_jax.ops.top_k import top_k


def test_the_blockwise_top_k_equals_laxs_ties_included():
  rng = np.random.default_rng(0)
  for rows, width, k in [(6, 5000, 8), (2, 1100, 3), (3, 40, 4)]:
    x = rng.normal(size=(rows, width)).astype(np.float32)
    x[:, ::7] = np.round(x[:, ::7], 1)  # many tied values
    x[0] = NEG_INF
    x[0, 900 % width] = 0.0  # one finite score, the rest tied
    for ours, lax in zip(top_k(jnp.asarray(x), k), jax.lax.top_k(jnp.asarray(x), k)):
      np.testing.assert_array_equal(np.asarray(ours), np.asarray(lax))
