"""A run planned to fit a stated time: the arithmetic, the record a resumed run keeps, the
measurement of a step, and a planned run of the tiny config end to end."""

import dataclasses
import json
import logging
import time

import jax
import jax.numpy as jnp
import pytest

from tests import helpers
from transformer_jax.config.parse import from_config_dict
from transformer_jax.errors import CheckpointError, ConfigError
from transformer_jax.training import planning
from transformer_jax.workdir import layout

PLAN_ARGS = dict(minutes=(10.0, "config.plan.minutes"), seconds_before=60.0, seconds_per_step=0.5,
                 positions_per_step=8192, validation_sentences=1000, test_sentences=1000,
                 eval_every_steps=100, validation_share=0.05, max_steps=0,
                 recipes=(1000, 0.5, 0.0),
                 machine="a test machine")


@pytest.fixture(autouse=True)
def _a_sentence_decodes_in_three_hundredths_of_a_step(monkeypatch):
  monkeypatch.setattr(planning, "STEPS_PER_DECODED_SENTENCE", 0.03)  # (the figures below)
  monkeypatch.setattr(planning, "UNMEASURED_SHARE", 0.0)  # (but in the test of it)


def _plan(**changes) -> planning.Plan:
  if "minutes" in changes:
    changes["minutes"] = (changes["minutes"], "config.plan.minutes")
  return planning.make_plan(**{**PLAN_ARGS, **changes})


def test_the_plan_fits_its_minutes_with_the_decoding_it_keeps():
  plan = _plan()
  sentence = planning.STEPS_PER_DECODED_SENTENCE * 0.5  # seconds a sentence decodes
  # 600 s: 60 spent, the test (1000 sentences) and the last validation (1000) kept, and
  # 5% of the training time for validations before the last, whole ones only
  train = 600 - 60 - 2000 * sentence
  earlier = int(0.05 * train / (1000 * sentence))
  assert earlier == 1
  assert plan.num_train_steps == int((train - earlier * 1000 * sentence) / 0.5)
  assert plan.decode_seconds == pytest.approx((2000 + 1000 * earlier) * sentence)
  total = plan.seconds_before + plan.num_train_steps * 0.5 + plan.decode_seconds
  assert 600 - 0.5 < total <= 600
  # one validation before the last: half way; the last at the last step
  assert plan.eval_every_steps == -(-plan.num_train_steps // 2)
  assert plan.time_budget_minutes == pytest.approx(
      (600 - 60 - 1000 * sentence) * planning.BUDGET_MARGIN / 60, abs=0.01)
  assert plan.num_train_steps == 990 and not plan.long_recipe  # (from 1,000 steps)
  assert plan.sampling_alpha == 0.0
  at_990 = _plan(recipes=(990, 0.5, 0.0))
  assert at_990.long_recipe and at_990.sampling_alpha == 0.5
  assert _plan(minutes=10.5).long_recipe


def test_a_fast_machine_stops_at_the_most_steps():
  capped = _plan(minutes=60.0, max_steps=2500)
  assert _plan(minutes=60.0).num_train_steps > 2500 and capped.num_train_steps == 2500
  assert capped.eval_every_steps >= 100 and capped.long_recipe


def test_the_long_recipe_samples_only_where_the_data_can():
  planned = {"num_train_steps": 0, "plan.minutes": 5.0, "plan.sampling_alpha": 0.5,
             "data.subword_sampling.alpha": 0.0}
  assert planning.long_recipe_alpha(from_config_dict(helpers.tiny_config(**planned))) == 0.5
  text_path = from_config_dict(helpers.tiny_config(**planned, **{"data.pretokenize": False}))
  assert planning.long_recipe_alpha(text_path) == 0.0  # (sampling needs the token-id store)
  unset = from_config_dict(helpers.tiny_config(**{**planned, "plan.sampling_alpha": 0.0,
                                                  "data.subword_sampling.alpha": 0.3}))
  assert planning.long_recipe_alpha(unset) == 0.3  # (0: the configured alpha)


def test_a_share_of_the_minutes_is_left_for_what_the_plan_does_not_time(monkeypatch):
  monkeypatch.setattr(planning, "UNMEASURED_SHARE", 0.05)
  plan = _plan()
  total = plan.seconds_before + plan.num_train_steps * 0.5 + plan.decode_seconds
  assert 570 - 0.5 < total <= 570  # (5% of 600 s left)


def test_validations_before_the_last_follow_the_share_and_the_configured_interval():
  assert _plan(validation_share=0.0).eval_every_steps == _plan(
      validation_share=0.0).num_train_steps  # the last step only
  many = _plan(validation_share=0.5)
  assert many.eval_every_steps >= 100  # no more often than config.eval_every_steps
  earlier = (many.num_train_steps - 1) // many.eval_every_steps  # (the last: at the last step)
  assert earlier == 7
  assert many.decode_seconds == pytest.approx(15.0 + 15.0 * (earlier + 1))  # each kept


def test_a_short_plan_trains_the_short_recipe_and_at_least_one_step():
  short = _plan(minutes=3.0)
  assert short.num_train_steps < 1000 and not short.long_recipe
  assert "steps of the short recipe (no subword sampling) in" in short.summary()
  assert "of the long recipe (subword sampling alpha 0.5)" in _plan(minutes=12.0).summary()
  assert _plan(recipes=(0, 0.5, 0.0), minutes=3.0).sampling_alpha == 0.5
  spent = _plan(minutes=0.5)  # the set-up alone took longer
  assert spent.num_train_steps == 1


def test_the_plan_is_applied_to_the_config_and_its_record():
  c = helpers.tiny_config(**{"num_train_steps": 0, "plan.minutes": 5.0,
                             "data.subword_sampling.alpha": 0.3, "time_budget_minutes": 0.0})
  cfg, recorded = planning.apply(_plan(minutes=3.0), from_config_dict(c), c.to_dict())
  for values in (dataclasses.asdict(cfg), recorded):
    assert values["num_train_steps"] == _plan(minutes=3.0).num_train_steps
    assert values["data"]["subword_sampling"]["alpha"] == 0.0  # the short recipe
    assert values["time_budget_minutes"] == _plan(minutes=3.0).time_budget_minutes
  # a time budget of the config's own that is shorter stays
  c2 = helpers.tiny_config(**{"num_train_steps": 0, "plan.minutes": 5.0,
                              "time_budget_minutes": 0.5})
  assert planning.apply(_plan(), from_config_dict(c2), None)[0].time_budget_minutes == 0.5


def test_f32_matmuls_get_their_own_minutes_where_set():
  c = from_config_dict(helpers.tiny_config(**{"plan.minutes": 5.0, "plan.f32_minutes": 7.0}))
  assert planning.minutes_for(c.plan, "float32") == (7.0, "config.plan.f32_minutes: matmuls "
                                                          "in float32")
  assert planning.minutes_for(c.plan, "bfloat16") == (5.0, "config.plan.minutes")
  unset = from_config_dict(helpers.tiny_config(**{"plan.f32_minutes": 0.0}))
  assert planning.minutes_for(unset.plan, "float32")[0] == unset.plan.minutes


def test_a_recorded_plan_is_read_back_and_a_damaged_one_named(tmp_path):
  assert planning.recorded(tmp_path) is None
  plan = _plan()
  planning.record(plan, tmp_path)
  assert planning.recorded(tmp_path) == plan
  values = json.loads((tmp_path / layout.PLAN).read_text())
  (tmp_path / layout.PLAN).write_text(json.dumps({**values, "a_later_field": 1}))
  assert planning.recorded(tmp_path) == plan  # (a newer version's fields are not damage)
  for damaged in ('{"minutes": 3', '{"minutes": 3}'):  # (not JSON; a field missing)
    (tmp_path / layout.PLAN).write_text(damaged)
    with pytest.raises(CheckpointError, match=r"plan\.json is damaged .*: mend it, or set "
                                              r"config.num_train_steps"):
      planning.recorded(tmp_path)
    assert (tmp_path / layout.PLAN).read_text() == damaged  # left as it was


@pytest.mark.parametrize("overrides, message", [
    ({"num_train_steps": 0, "plan.minutes": 0.0}, r"num_train_steps=0 must be >= 1, or 0 with"),
    ({"num_train_steps": 0, "plan.minutes": 5.0, "optimizer.schedule": "cosine"},
     r"needs config.optimizer.schedule 'inverse_sqrt' or 'constant', not 'cosine'"),
    ({"num_train_steps": 0, "plan.minutes": 5.0, "population.seeds": 2},
     r"not for a population"),
    ({"plan.validation_share": 1.0}, r"config.plan.validation_share=1.0 must be in"),
])
def test_a_plan_the_config_cannot_have_is_one_line_naming_the_key(overrides, message):
  with pytest.raises(ConfigError, match=message):
    from_config_dict(helpers.tiny_config(**overrides))


def test_a_step_is_timed_on_a_copy_of_the_state_after_the_call_that_compiles():
  donating = jax.jit(lambda state: {"w": state["w"] + 1}, donate_argnums=0)  # (as the step)
  calls = []

  def step(state, batch, rng, *args):
    calls.append(args)
    time.sleep(0.05 if len(calls) == 1 else 0.01)  # (the first call "compiles")
    return donating(state), {"loss": jnp.float32(0)}

  state = {"w": jnp.zeros(3)}
  seconds = planning.measure_step_seconds(step, state, {}, None, (1.0,), steps=3)
  assert 0.01 <= seconds < 0.05 and len(calls) == 4 and calls[0] == (1.0,)
  assert float(state["w"].sum()) == 0.0  # the run's own state neither donated nor changed


def test_a_planned_run_trains_its_plan_and_a_resumed_run_keeps_it(
    tfds_cache, tiny_tokenizer, tmp_path, monkeypatch, caplog):
  run = tmp_path / "run"
  over = {"num_train_steps": 0, "plan.minutes": 0.2, "plan.f32_minutes": 0.0,
          "plan.validation_share": 0.0, "plan.sampling_alpha": 0.5,
          "time_budget_minutes": 0.0, "data.test_split": "", "data.subword_sampling.alpha": 0.0}
  # a machine whose step takes 1 s, 5 s after the command started: 12 s of plan, 5 spent,
  # the last validation's time kept (a sentence: 0.03 steps). The real probe runs (its
  # figure replaced): the run's steps must reuse the program it compiled.
  probed, measure = [], planning.measure_step_seconds

  def measured(step_fn, *args):
    probed.append(step_fn)
    assert measure(step_fn, *args) > 0
    return 1.0

  monkeypatch.setattr(planning, "seconds_since_start", lambda: 5.0)
  monkeypatch.setattr(planning, "measure_step_seconds", measured)
  with caplog.at_level(logging.INFO, logger="transformer_jax"):
    helpers.train_in_process(run, tfds_cache, tiny_tokenizer, **over)
  plan = planning.recorded(run)
  assert plan.num_train_steps == int(12 - 5 - plan.decode_seconds) >= 5
  assert not plan.long_recipe and plan.sampling_alpha == 0.0  # (short: as configured)
  assert "Plan: this machine trains" in caplog.text and "(1.000 s a step)" in caplog.text
  assert "The run took" in caplog.text
  assert helpers.logged(run, "time/run_minutes", plan.num_train_steps) > 0  # (and metrics say it)
  assert probed[0]._cache_size() == 1  # one program: the probe's batch is the batches' kind
  config = json.loads((run / "config.json").read_text())
  assert config["num_train_steps"] == plan.num_train_steps
  assert config["eval_every_steps"] == plan.eval_every_steps == plan.num_train_steps
  assert helpers.checkpoint_steps(run)[-1] == plan.num_train_steps

  # run again on another machine with another alpha: the recorded plan holds (nothing left
  # to train), nothing is measured
  monkeypatch.setattr(planning, "measure_step_seconds", pytest.fail)
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="transformer_jax"):
    helpers.train_in_process(run, tfds_cache, tiny_tokenizer,
                             **{**over, "data.subword_sampling.alpha": 0.3})
  assert "The plan recorded in" in caplog.text
  assert f"Resuming from step {plan.num_train_steps}" in caplog.text
  assert json.loads((run / "config.json").read_text())["data"]["subword_sampling"][
      "alpha"] == 0.0

  # steps set by hand win over the plan; the batches keep its recipe
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="transformer_jax"):
    helpers.train_in_process(run, tfds_cache, tiny_tokenizer,
                             **{**over, "num_train_steps": plan.num_train_steps + 1,
                                "data.subword_sampling.alpha": 0.3})
  assert "is not followed, but its recipe is (subword sampling alpha 0, as trained)" in (
      caplog.text)
  assert helpers.checkpoint_steps(run)[-1] == plan.num_train_steps + 1
  config = json.loads((run / "config.json").read_text())
  assert config["num_train_steps"] == plan.num_train_steps + 1
  assert config["data"]["subword_sampling"]["alpha"] == 0.0


def test_a_run_trained_before_plans_resumes_as_it_was_trained(tiny_run, tfds_cache,
                                                               tiny_tokenizer, tmp_path,
                                                               monkeypatch, caplog):
  run = helpers.copy_run(tiny_run, tmp_path / "run")
  monkeypatch.setattr(planning, "measure_step_seconds", pytest.fail)
  with caplog.at_level(logging.INFO, logger="transformer_jax"):
    final = helpers.train_in_process(run, tfds_cache, tiny_tokenizer,
                                     **{"num_train_steps": 0, "data.test_split": ""})
  assert "was trained without a plan: it resumes with the values its config.json records " \
         "(num_train_steps=20" in caplog.text
  assert final == {} and helpers.checkpoint_steps(run) == [10, 20]  # (nothing more to train)
  assert json.loads((run / "config.json").read_text())["num_train_steps"] == 20
  assert not (run / layout.PLAN).exists()


def test_steps_set_by_hand_win_over_the_plan(tiny_run):
  # (the tiny config inherits config.plan.minutes from the default; its steps are set)
  assert helpers.tiny_config()["plan"]["minutes"] > 0
  assert not (tiny_run / layout.PLAN).exists()
  assert json.loads((tiny_run / "config.json").read_text())["num_train_steps"] == 20
