"""The learning-rate schedule: linear warmup, then inverse square root."""

import pytest

from tests import helpers
from transformer_jax.training import optimizer


def test_learning_rate_warms_up_linearly_then_decays_as_inverse_sqrt():
  sched = optimizer.learning_rate_schedule(helpers.section("optimizer", learning_rate=1e-3,
                                                           warmup_steps=100))
  assert float(sched(0)) == pytest.approx(1e-5)
  assert float(sched(49)) == pytest.approx(5e-4)
  assert float(sched(99)) == pytest.approx(1e-3)
  assert float(sched(399)) == pytest.approx(1e-3 * 0.5)
