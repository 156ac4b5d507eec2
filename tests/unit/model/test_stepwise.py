"""The model's decoding interface (`model.stepwise`): the parts a search relies on beside the
model's own layers (those: test_transformer, test_attention)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.model import stepwise
from transformer_jax.ops.platform import tracing_for


@pytest.mark.parametrize("platform", ["cpu", "tpu"])
def test_the_step_s_log_softmax_is_jax_s_to_the_bit(platform):
  """The CPU's form (its maximum taken without the first column, then with it) gives
  jax.nn.log_softmax's values exactly, the first column the largest of its row included
  (shifted by anything less, exp overflows); elsewhere it is jax.nn.log_softmax."""
  logits = np.array(jax.random.normal(jax.random.PRNGKey(0), (6, 300)) * 8, np.float32)
  logits[1, 0] = 200.0  # (the first column its row's maximum, beyond exp's range)
  logits[2, 5:] = -np.inf
  with tracing_for(platform):  # (a jit of its own: jax's trace cache knows no platform)
    got = jax.jit(lambda x: stepwise._log_softmax(x))(jnp.asarray(logits))
  np.testing.assert_array_equal(got, jax.jit(jax.nn.log_softmax)(logits))
