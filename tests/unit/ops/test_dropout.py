"""The counter-based dropout: its rate, rescaling, and independence of keys and neighbours."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.ops.dropout import Dropout


@pytest.mark.parametrize("shape", [(64, 32, 512), (3, 5, 7)])
def test_dropout_drops_at_the_rate_and_rescales(shape):
  x = jnp.ones(shape)
  drop = Dropout(0.1)
  y = np.asarray(drop.apply({}, x, False, rngs={"dropout": jax.random.PRNGKey(0)}))
  kept = y != 0
  np.testing.assert_allclose(y[kept], 1 / 0.9, rtol=1e-6)  # inverted dropout
  n = kept.size
  assert abs(1 - kept.mean() - 0.1) < 5 * np.sqrt(0.1 * 0.9 / n)
  other = np.asarray(drop.apply({}, x, False, rngs={"dropout": jax.random.PRNGKey(1)}))
  assert (other != y).any()  # another key, another mask
  if n > 10_000:  # masks of different keys, and neighbouring elements, are uncorrelated
    a, b = kept.ravel().astype(float), (other != 0).ravel().astype(float)
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / np.sqrt(n)
    assert abs(np.corrcoef(a[:-1], a[1:])[0, 1]) < 5 / np.sqrt(n)
  assert drop.apply({}, x, True) is x  # deterministic: the identity
