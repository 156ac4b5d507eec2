"""The pure train step on the tiny config: golden metrics, learning, non-finite updates.
(Its layout variants, compiled apart: tests/integration/test_step_variants.py.)"""

import functools

import jax
import numpy as np
import pytest

from tests.helpers import fixed_batch, tiny_setup
from transformer_jax.training import step as train_lib

# Golden values of the first two steps of the tiny config (f32, seed 0) on `fixed_batch`.
# They change only when the model, initialisation, loss or optimizer change: update them
# deliberately, with the reason in the commit message.
GOLDEN = [
    {"loss": 5.801586, "nll": 6.748532, "num_tokens": 112.0, "grad_norm": 1.292804},
    {"loss": 5.872424, "nll": 6.828216, "num_tokens": 112.0, "grad_norm": 1.336304},
]


def run_two_steps():
  cfg, model, state = tiny_setup()
  step = jax.jit(functools.partial(train_lib.train_step, model=model,
                                   label_smoothing=cfg.label_smoothing))
  batch = fixed_batch()
  out = []
  for _ in range(2):
    state, m = step(state, batch, jax.random.PRNGKey(0))
    m = jax.device_get(m)
    out.append({"loss": m["loss_sum"] / m["num_tokens"], "nll": m["nll_sum"] / m["num_tokens"],
                "num_tokens": m["num_tokens"], "grad_norm": m["grad_norm"]})
  return out


def test_train_step_matches_golden_metrics():
  got = run_two_steps()
  for step, (g, want) in enumerate(zip(got, GOLDEN)):
    for key, value in want.items():
      assert float(g[key]) == pytest.approx(value, rel=1e-4), (step, key, g[key])
  # (whether the update helps is test_training_reduces_loss_on_a_repeated_batch's question:
  # here each step draws other dropout masks)


def test_training_reduces_loss_on_a_repeated_batch():
  cfg, model, state = tiny_setup(**{"optimizer.learning_rate": 1e-2})
  step = jax.jit(functools.partial(train_lib.train_step, model=model, label_smoothing=0.0))
  batch = fixed_batch()
  first = None
  for i in range(30):
    state, m = step(state, batch, jax.random.PRNGKey(i))
    loss = float(m["loss_sum"] / m["num_tokens"])
    first = loss if first is None else first
  assert loss < 0.5 * first


def test_nonfinite_update_is_not_applied_and_is_counted():
  cfg, model, state = tiny_setup()
  step = jax.jit(functools.partial(train_lib.train_step, model=model,
                                   label_smoothing=cfg.label_smoothing, nonfinite_at_step=1))
  new, m = step(state, fixed_batch(), jax.random.PRNGKey(0))
  assert int(new.step) == int(state.step) + 1
  for a, b in zip(jax.tree_util.tree_leaves((new.params, new.opt_state)),
                  jax.tree_util.tree_leaves((state.params, state.opt_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  m = jax.device_get(m)
  assert m["nonfinite_steps"] == 1 and m["first_nonfinite_step"] == 1
  assert m["loss_sum"] == 0 and m["num_tokens"] == 0  # kept out of the logged averages
  # The next (finite) step applies its update.
  newer, m2 = step(new, fixed_batch(), jax.random.PRNGKey(0))
  assert m2["nonfinite_steps"] == 0 and np.isinf(m2["first_nonfinite_step"])
  assert not np.array_equal(np.asarray(jax.tree_util.tree_leaves(newer.params)[0]),
                            np.asarray(jax.tree_util.tree_leaves(new.params)[0]))


def test_the_moving_average_decay_warms_up_to_the_configured_one():
  assert float(train_lib.ema_decay_at(0.999, 1)) == pytest.approx(2 / 11)
  assert float(train_lib.ema_decay_at(0.999, 1000)) == pytest.approx(1001 / 1010)
  assert float(train_lib.ema_decay_at(0.999, 100_000)) == pytest.approx(0.999)


def test_the_moving_average_after_k_steps_equals_its_closed_form():
  """ema_k = prod_t d_t p_0 + sum_i (1 - d_i) prod_{t>i} d_t p_i over the parameters p_i after
  each step, d_t = min(d, (1 + t) / (10 + t)); a skipped (non-finite) update leaves it."""
  d = 0.9
  cfg, model, state = tiny_setup(**{"optimizer.ema_decay": d, "optimizer.learning_rate": 1e-2})
  step = jax.jit(functools.partial(train_lib.train_step, model=model, label_smoothing=0.0,
                                   nonfinite_at_step=4))
  history = [state.params]
  for i in range(3):
    state, _ = step(state, fixed_batch(seed=i), jax.random.PRNGKey(i))
    history.append(state.params)
  k = len(history) - 1
  decays = [min(d, (1 + t) / (10 + t)) for t in range(k + 1)]  # decays[t]: at update t
  assert decays[1:] == pytest.approx([2 / 11, 3 / 12, 4 / 13])  # (warming up; d = 0.9 later)
  expected = jax.tree_util.tree_map(
      lambda *ps: np.prod(decays[1:]) * np.asarray(ps[0], np.float64) + sum(
          (1 - decays[i]) * np.prod(decays[i + 1:]) * np.asarray(p, np.float64)
          for i, p in enumerate(ps) if i > 0), *history)
  for got, want in zip(jax.tree_util.tree_leaves(state.ema_params),
                       jax.tree_util.tree_leaves(expected)):
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-7)
  assert state.eval_params is state.ema_params
  assert not np.array_equal(np.asarray(jax.tree_util.tree_leaves(state.ema_params)[0]),
                            np.asarray(jax.tree_util.tree_leaves(state.params)[0]))
  skipped, m = step(state, fixed_batch(seed=3), jax.random.PRNGKey(3))  # (step 4: NaN grads)
  assert float(m["nonfinite_steps"]) == 1.0
  for a, b in zip(jax.tree_util.tree_leaves(skipped.ema_params),
                  jax.tree_util.tree_leaves(state.ema_params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
