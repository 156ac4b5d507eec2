"""The learning-rate schedule: linear warmup, then inverse square root; the cooldown factor on
the update (its value over training: test_decisions.py)."""

import dataclasses
import functools
import re

import jax
import numpy as np
import pytest

from tests import helpers, model_variants
from transformer_jax.config import sections
from transformer_jax.errors import ConfigError
from transformer_jax.model.transformer import Transformer
from transformer_jax.training import optimizer
from transformer_jax.training import state as state_lib
from transformer_jax.training import step as train_lib


def test_learning_rate_warms_up_linearly_then_decays_as_inverse_sqrt():
  sched = optimizer.learning_rate_schedule(helpers.section("optimizer", learning_rate=1e-3,
                                                           warmup_steps=100), 1000)
  assert float(sched(0)) == pytest.approx(1e-5)
  assert float(sched(49)) == pytest.approx(5e-4)
  assert float(sched(99)) == pytest.approx(1e-3)
  assert float(sched(399)) == pytest.approx(1e-3 * 0.5)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "constant"])
def test_the_other_schedules_warm_up_alike_then_decay_to_near_zero_at_the_last_step(schedule):
  sched = optimizer.learning_rate_schedule(helpers.section(
      "optimizer", learning_rate=1e-3, warmup_steps=100, schedule=schedule), 1000)
  rates = np.asarray([float(sched(s)) for s in range(1000)])
  np.testing.assert_allclose(rates[:99], 1e-3 * np.arange(1, 100) / 100, rtol=1e-5)
  assert rates[99] == pytest.approx(1e-3)  # the peak, at the end of warmup
  left = (1000 - np.arange(100, 1001) + 1) / 901  # 1 at the peak, 1/901 at the last update
  expected = {"constant": np.ones_like(left), "linear": left,
              "cosine": 0.5 * (1 - np.cos(np.pi * left))}[schedule]
  np.testing.assert_allclose(rates[99:], 1e-3 * expected, rtol=1e-4, atol=1e-9)
  if schedule != "constant":
    assert 0 < rates[-1] < 1e-5 and np.all(np.diff(rates[99:]) < 0)
  past_the_end = float(sched(5000))
  assert past_the_end == pytest.approx(1e-3 if schedule == "constant" else 0.0)


def test_the_cooldown_factor_scales_the_update():
  cfg, model, state = helpers.tiny_setup()
  step = jax.jit(functools.partial(train_lib.train_step, model=model,
                                   label_smoothing=cfg.label_smoothing))
  batch, rng = helpers.fixed_batch(), jax.random.PRNGKey(0)
  before = jax.device_get(state.params)
  deltas = {}
  for s in (1.0, 0.5, 0.0):
    new, _ = step(state, batch, rng, np.float32(s))
    deltas[s] = jax.tree_util.tree_map(lambda a, b: np.asarray(a) - b,
                                       jax.device_get(new.params), before)
    assert int(new.step) == 1
  for full, half, none in zip(*(jax.tree_util.tree_leaves(deltas[s]) for s in (1.0, 0.5, 0.0))):
    np.testing.assert_allclose(half, 0.5 * full, rtol=1e-4, atol=1e-7)
    assert not none.any()


def _decayed_names(**model_fields) -> set[str]:
  """The parameters (a stack's layers as one `encoder_layer`/`decoder_layer`) that weight decay
  applies to in the tiny model with `model_fields`, from the shapes alone (the mask the
  optimizer takes: its effect on training, test_step_variants.py)."""
  cfg = helpers.tiny_train_config(**{f"model.{k}": v for k, v in model_fields.items()})
  abstract = state_lib.abstract_state(cfg, Transformer(cfg.model), helpers._mesh())
  mask = optimizer.decayed(abstract.params, cfg.optimizer.weight_decay_exclude)
  return {re.sub(r"^(encoder|decoder)_(\d+|layers)/", r"\1_layer/",
                 jax.tree_util.keystr(path, simple=True, separator="/"))
          for path, decays in jax.tree_util.tree_leaves_with_path(mask) if decays}


@pytest.mark.parametrize("variant", sorted(model_variants.VARIANTS))
def test_weight_decay_takes_kernels_and_embeddings_by_name_scanned_or_not(variant):
  fields = model_variants.model_fields(variant)
  names = {scan: _decayed_names(**{**fields, "scan_layers": scan}) for scan in (False, True)}
  assert names[True] == names[False]
  assert {name.rsplit("/", 1)[-1] for name in names[False]} <= {
      "kernel", "embedding", "position_embedding"}
  assert "encoder_layer/feed_forward/wo/kernel" in names[False]


def test_a_weight_decay_pattern_that_names_no_parameter_is_a_config_error():
  _, _, state = helpers.tiny_setup()
  with pytest.raises(ConfigError, match=r"weight_decay_exclude: '\*Bias' matches no parameter"):
    optimizer.decayed(state.params, ("*bias", "*Bias"))
  kept = optimizer.decayed(state.params, ("*layer_norm/scale",))  # (a pattern crosses "/")
  assert not kept["encoder_0"]["ffn_block"]["layer_norm"]["scale"]
  assert kept["encoder_0"]["ffn_block"]["layer_norm"]["bias"]


def test_runs_from_before_the_names_decay_by_rank_as_they_did():
  """A config.json without weight_decay_exclude reads as "ndim<2": the (heads, head_dim)
  biases (and a scanned model's stacked norm scales) decay, as they did in those runs."""
  assert helpers.section("optimizer").weight_decay_exclude == ("*bias", "*scale")
  field = {f.name: f for f in dataclasses.fields(sections.OptimizerConfig)}
  assert field["weight_decay_exclude"].metadata["before"] == (sections.DECAY_BY_RANK,)
  _, _, state = helpers.tiny_setup()
  by_rank = optimizer.decayed(state.params, (sections.DECAY_BY_RANK,))
  assert jax.tree_util.tree_leaves(by_rank) == [
      p.ndim > 1 for p in jax.tree_util.tree_leaves(state.params)]
  assert by_rank["encoder_0"]["self_attention"]["query"]["bias"]  # (shape (4, 8))
  assert optimizer.decayed(state.params, ()) == jax.tree_util.tree_map(
      lambda _: True, state.params)
