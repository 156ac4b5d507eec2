"""The train step's layout variants train like the plain step: gradient accumulation over
micro-batches, rematerialisation, scanned layers (and scanned layers decode like per-layer
ones). Each variant is another whole program to compile, so these run in the integration tier.
"""

import functools

import jax
import numpy as np
import pytest

from tests.helpers import fixed_batch, stack_layers, tiny_setup, tiny_train_config
from tests.model_variants import VARIANTS
from transformer_jax.decoding import search as decode
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.model import transformer as model_lib
from transformer_jax.training import step as train_lib

# One jitted step for all tests below: equal models share compilations.
_step = jax.jit(train_lib.train_step,
                static_argnames=("model", "label_smoothing", "num_micro_batches"))


def _train_losses(model, state, steps=3, **kwargs):
  """Per-step (loss, gradient norm) of a few steps on fixed batches."""
  out = []
  for i in range(steps):
    state, m = _step(state, fixed_batch(seed=i), jax.random.PRNGKey(0), model=model,
                     label_smoothing=0.1, **kwargs)
    out.append((float(m["loss_sum"] / m["num_tokens"]), float(m["grad_norm"])))
  return state, out


@functools.lru_cache(maxsize=1)
def _plain_run():
  """The reference: the tiny model without dropout (so that other layouts of the same
  computation draw no different masks), with weight decay (so that a layout decaying other
  parameters shows), and its losses and gradient norms over 30 steps."""
  cfg, model, state = tiny_setup(**{"model.dropout_rate": 0.0, "optimizer.weight_decay": 0.1})
  return cfg, model, state, _train_losses(model, state, steps=30)[1]


def test_gradient_accumulation_matches_the_full_batch():
  _, model, state, full = _plain_run()
  _, accum = _train_losses(model, state, num_micro_batches=2)  # (any k: the same sums)
  # Same losses and gradient norms over 3 steps: the same updates (parameters are not compared
  # bitwise: Adam turns float-rounding differences of near-zero gradients into full steps).
  assert np.asarray(accum) == pytest.approx(np.asarray(full[:3]), rel=1e-6)


# (scan and remat together: the block variants below)
@pytest.mark.parametrize("overrides", [{"model.remat": "full"}, {"model.remat": "dots"},
                                       {"model.scan_layers": True}])
def test_remat_and_scan_train_like_the_plain_model(overrides):
  cfg, _, state, plain = _plain_run()
  cfg2 = tiny_train_config(**{"model.dropout_rate": 0.0}, **overrides)
  params = state.params
  if cfg2.model.scan_layers:  # the same initial weights, stacked on a leading layer axis
    params = stack_layers(params, cfg.model)
    assert params["encoder_layers"]["feed_forward"]["wi"]["kernel"].shape == (2, 32, 64)
  model2 = model_lib.Transformer(cfg2.model)
  state2 = state.replace(params=params, opt_state=state.tx.init(params))
  # Scanned: 30 steps, as many as weight decay needs to part runs that decay other parameters
  # (stacked norm scales have a matrix's rank); f32, so 1e-5 relative after 30 Adam steps.
  steps = 30 if cfg2.model.scan_layers else 3
  _, other = _train_losses(model2, state2, steps=steps)
  assert np.asarray(other) == pytest.approx(np.asarray(plain[:steps]), rel=1e-5 if steps == 30
                                            else 1e-6)


@pytest.mark.parametrize("name", ["rmsnorm_swiglu_gqa_relative",
                                  "post_ln_rmsnorm_geglu_mqa_rotary_qk_norm",
                                  "marian_like_silu_concat_sinusoids_unscaled_output_bias"])
def test_block_variants_train_alike_with_scan_and_remat_on_and_off(name):
  variant = VARIANTS[name]
  cfg, model, state = tiny_setup(**{"model.dropout_rate": 0.0}, **variant)
  _, plain = _train_losses(model, state)
  assert np.isfinite(plain).all()
  for layout in ({"model.scan_layers": True, "model.remat": "full"}, {"model.remat": "dots"}):
    cfg2 = tiny_train_config(**{"model.dropout_rate": 0.0}, **variant, **layout)
    params = stack_layers(state.params, cfg.model) if cfg2.model.scan_layers else state.params
    state2 = state.replace(params=params, opt_state=state.tx.init(params))
    _, other = _train_losses(model_lib.Transformer(cfg2.model), state2)
    assert np.asarray(other) == pytest.approx(np.asarray(plain), rel=1e-6), layout


def test_scanned_model_decodes_like_the_per_layer_model():
  cfg, model, state = tiny_setup()
  model2 = model_lib.Transformer(tiny_train_config(**{"model.scan_layers": True}).model)
  stacked = stack_layers(state.params, cfg.model)
  inputs = fixed_batch()["inputs"][:4]
  seqs, scores = decode.beam_search(prepare(model, state.params), inputs, beam_size=2, alpha=0.6,
                                    max_len=12)
  seqs2, scores2 = decode.beam_search(prepare(model2, stacked), inputs, beam_size=2, alpha=0.6,
                                      max_len=12)
  np.testing.assert_array_equal(seqs, seqs2)
  np.testing.assert_allclose(scores, scores2, rtol=1e-6)




def test_the_moving_average_follows_scanned_and_rematerialised_layers():
  cfg, model, state = tiny_setup(**{"optimizer.ema_decay": 0.9, "model.scan_layers": True,
                                    "model.remat": "full"})
  state, _ = _train_losses(model, state, steps=2)
  assert state.ema_params["encoder_layers"]["feed_forward"]["wi"]["kernel"].shape == (2, 32, 64)
  for ema, p in zip(jax.tree_util.tree_leaves(state.ema_params),
                    jax.tree_util.tree_leaves(state.params)):
    assert ema.shape == p.shape and np.isfinite(np.asarray(ema)).all()
