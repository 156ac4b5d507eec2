"""The training loop's decisions as pure functions (training/decisions.py): when a step logs,
validates, saves or ends training; what a resumed run does first and carries over; the
cooldown and early stopping. No JAX, no model: the whole file runs in well under a second."""

import ast
import dataclasses
import inspect
import sys

import pytest

from tests import helpers
from transformer_jax.training import decisions
from transformer_jax.training.decisions import Decisions, Outcome

TINY = Decisions(num_train_steps=20, log_every_steps=5, eval_every_steps=10,
                 checkpoint_every_steps=10)


def walk(sched: Decisions, stop_at: dict | None = None, **signals):
  """The steps at which an uninterrupted run logs, validates and saves; `signals` maps a
  keyword of Decisions.actions to the set of steps it holds at."""
  done = {"log": [], "validate": [], "save": []}
  signals = {"preempted": (), "budget_spent": (), **signals}
  for step in range(1, sched.num_train_steps + 1):
    actions = sched.actions(step, **{k: step in v for k, v in signals.items()})
    if actions.validate and stop_at and step in stop_at:
      actions = actions.after_validation(stop_at[step])
    for name in done:
      if getattr(actions, name):
        done[name].append(step)
    if actions.last:
      break
  return done


def test_a_plain_run_logs_validates_and_saves_at_its_intervals_and_its_last_step():
  assert walk(TINY) == {"log": [5, 10, 15, 20], "validate": [10, 20], "save": [10, 20]}
  odd = Decisions(num_train_steps=13, log_every_steps=5, eval_every_steps=10,
                  checkpoint_every_steps=4)
  # every save logs (a resumed run reads its data counts there); the last step does all three
  assert walk(odd) == {"log": [4, 5, 8, 10, 12, 13], "validate": [10, 13],
                       "save": [4, 8, 12, 13]}


def test_a_preempted_step_is_saved_and_logged_but_not_validated_and_ends_training():
  actions = TINY.actions(7, preempted=True, budget_spent=False)
  assert actions.save and actions.log and actions.last and not actions.validate
  assert not actions.out_of_time
  assert walk(TINY, preempted={7}) == {"log": [5, 7], "validate": [], "save": [7]}


def test_a_spent_time_budget_ends_training_like_a_last_step():
  actions = TINY.actions(3, preempted=False, budget_spent=True)
  assert actions.out_of_time and actions.last and actions.save and actions.validate
  assert walk(TINY, budget_spent={3}) == {"log": [3], "validate": [3], "save": [3]}
  # spent exactly at the last step: an ordinary end, not a budget stop
  assert not TINY.actions(20, preempted=False, budget_spent=True).out_of_time


def test_wall_clock_intervals_are_asked_at_logging_steps_and_act_when_due():
  assert [s for s in range(1, 21) if TINY.asks_wall_clock(s, True)] == [5, 10, 15, 20]
  assert not TINY.asks_wall_clock(5, False)
  actions = TINY.actions(5, preempted=False, budget_spent=False, due_eval=True, due_save=True)
  assert actions.validate and actions.save and actions.log and not actions.last
  assert walk(TINY, due_eval={5, 15}) == {"log": [5, 10, 15, 20], "validate": [5, 10, 15, 20],
                                          "save": [10, 20]}


def test_stopping_early_or_a_cancelled_validation_ends_training_with_a_save():
  assert walk(TINY, stop_at={10: Outcome.STOP_EARLY}) == {
      "log": [5, 10], "validate": [10], "save": [10]}
  actions = TINY.actions(15, preempted=False, budget_spent=False, due_eval=True)
  assert not actions.save
  for outcome in (Outcome.STOP_EARLY, Outcome.CANCELLED):
    after = actions.after_validation(outcome)
    assert after.last and after.save
  assert actions.after_validation(Outcome.GO_ON) == actions


def test_a_resumed_run_validates_a_cut_short_step_first_and_trains_nothing_on_a_spent_budget():
  cancelled = [{"step": 10, "train/loss": 1.0}, {"step": 10, decisions.VALIDATION_CANCELLED: 1.0}]
  assert TINY.start(cancelled, 10, budget_spent=False) == decisions.Start(True, False)
  validated_since = cancelled + [{"step": 10, "eval/bleu": 3.0}]
  assert not TINY.start(validated_since, 10, False).validate_first
  assert not TINY.start(cancelled, 5, False).validate_first  # another step's mark
  assert TINY.start([], 3, budget_spent=True).budget_spent
  assert not TINY.start([], 20, budget_spent=True).budget_spent  # finished: nothing to say


def test_the_decisions_of_a_config():
  cfg = helpers.tiny_config()
  sched = Decisions.of(cfg)
  assert (sched.num_train_steps, sched.log_every_steps, sched.eval_every_steps,
          sched.checkpoint_every_steps) == (cfg.num_train_steps, cfg.log_every_steps,
                                            cfg.eval_every_steps, cfg.checkpoint_every_steps)
  assert sched.learning_rate_scale(cfg.num_train_steps, 0.0) == 1.0  # no cooldown


def test_cooldown_decays_to_zero_at_the_last_step_or_at_the_end_of_the_time_budget():
  scale = decisions.cooldown_scale
  assert scale(0.0, 100, 100) == 1.0  # no cooldown
  assert scale(0.2, 80, 100) == 1.0 and scale(0.2, 81, 100) == pytest.approx(1.0)
  assert scale(0.2, 91, 100) == pytest.approx(0.5)
  assert scale(0.2, 100, 100) == pytest.approx(0.05)  # the last update is small, not zero
  # with a time budget that ends training first: the wall clock decides
  assert scale(0.2, 10, 100, minutes=15.0, budget_minutes=20.0) == pytest.approx(1.0)
  assert scale(0.2, 10, 100, minutes=18.0, budget_minutes=20.0) == pytest.approx(0.5)
  assert scale(0.2, 10, 100, minutes=25.0, budget_minutes=20.0) == 0.0
  # ... and the steps when they end first
  assert scale(0.2, 91, 100, minutes=1.0, budget_minutes=20.0) == pytest.approx(0.5)
  cooled = Decisions(100, 10, 10, 10, cooldown_fraction=0.2, time_budget_minutes=20.0)
  assert cooled.learning_rate_scale(10, 18.0) == pytest.approx(0.5)


def test_a_larger_budget_after_a_budget_stop_ramps_the_cooldown_back_up_without_a_jump():
  """The rule (Decisions.learning_rate_scale): resumed below the new schedule's factor, the
  factor ramps linearly from where it stopped over warmup_steps updates."""
  old = Decisions(1000, 10, 10, 10, cooldown_fraction=0.2, time_budget_minutes=20.0,
                  warmup_steps=50)
  stop_factor = old.learning_rate_scale(300, 20.0)  # the budget ran out at step 300
  assert stop_factor == 0.0
  new = dataclasses.replace(old, time_budget_minutes=60.0)  # rerun with a larger budget
  factors = [new.learning_rate_scale(step, 20.0 + (step - 300) * 0.01, (300, stop_factor))
             for step in range(301, 500)]
  steps = [stop_factor] + factors
  assert max(abs(b - a) for a, b in zip(steps, steps[1:])) <= 1 / 50 + 1e-9  # no jump
  assert factors[0] == 1 / 50 and factors[49] == 1.0  # ramped up over 50 updates
  # A plain resume (its factor at or above the schedule's) follows the schedule at once.
  assert new.learning_rate_scale(301, 55.0, (300, 0.9)) == new.learning_rate_scale(301, 55.0)


def test_early_stopping_counts_evaluations_without_improvement_across_a_resume():
  stopper = decisions.EarlyStopping(2, [])
  assert [stopper.update(b) for b in (1.0, 2.0, 1.5, 2.5, 2.5)] == [False] * 4 + [False]
  assert stopper.update(2.0) and stopper.best == 2.5
  resumed = decisions.EarlyStopping(2, decisions.bleu_history(
      [{"step": 10, "eval/bleu": 3.0}, {"step": 15, "train/loss": 1.0},
       {"step": 20, "eval/bleu": 2.0}]))
  assert resumed.best == 3.0 and resumed.update(2.9)  # the second without improvement
  never = decisions.EarlyStopping(0, [5.0, 1.0, 1.0, 1.0])
  assert not never.update(0.0)


def test_a_resumed_run_carries_the_newest_logged_counts_and_minutes_on():
  history = [{"step": 5, "data/pairs_kept": 40, "data/corpus/a/pairs": 30,
              "time/train_minutes": 0.5},
             {"step": 10, "data/pairs_kept": 80, "data/filtered_too_long": 2,
              "data/corpus/a/pairs": 60, "data/corpus/a/tokens": 900,
              "time/train_minutes": 1.25},
             {"step": 10, "eval/bleu": 1.0}]
  fields, corpus = decisions.carried_counts(history, ["a", "b"])
  assert fields == {"empty": 0, "too_long": 2, "kept": 80}
  assert corpus == {"pairs": [60, 0], "tokens": [900, 0]}
  assert decisions.last_logged(history, "time/train_minutes", 0.0) == 1.25
  assert decisions.last_logged([], "time/train_minutes", 0.0) == 0.0


def test_the_decisions_are_pure_python():
  imported = set()
  for node in ast.walk(ast.parse(inspect.getsource(decisions))):
    if isinstance(node, ast.Import):
      imported |= {alias.name.split(".")[0] for alias in node.names}
    elif isinstance(node, ast.ImportFrom):
      imported.add(node.module.split(".")[0])
  imported.discard("__future__")
  assert imported <= set(sys.stdlib_module_names), imported
