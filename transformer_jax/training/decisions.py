"""What the training loop does, decided as pure code: given the step, the clocks and the
metrics history, whether to log, validate, save, stop or cool down, and what a resumed run
carries over from its history. No JAX here: every decision is tested without training."""

from __future__ import annotations

import dataclasses
import enum

# Marks a validation that SIGTERM cut short, at its step in metrics.jsonl.
VALIDATION_CANCELLED = "eval/cancelled"


class Outcome(enum.Enum):
  """How a validation ended."""
  GO_ON = "go on"
  STOP_EARLY = "stop early"  # validation BLEU stopped improving (config.early_stopping_patience)
  CANCELLED = "cancelled"    # SIGTERM cut it short: the resumed run validates the step first


@dataclasses.dataclass(frozen=True)
class Actions:
  """What happens after a step's update."""
  log: bool        # train metrics written (also at every save: a resume reads its counts there)
  validate: bool
  save: bool
  last: bool       # no step follows (the last step, a preemption, a spent budget, early stop)
  out_of_time: bool  # the time budget ended training before config.num_train_steps

  def after_validation(self, outcome: Outcome) -> Actions:
    """These actions once validation ended with `outcome`: stopping early or cancelled ends
    training, and a last step is always saved."""
    last = self.last or outcome is not Outcome.GO_ON
    return dataclasses.replace(self, last=last, save=self.save or last)


@dataclasses.dataclass(frozen=True)
class Start:
  """What a (resumed) run does before its first step."""
  validate_first: bool  # the validation of the start step was cut short: done first
  budget_spent: bool    # the time budget was spent by earlier runs: no step is trained


@dataclasses.dataclass(frozen=True)
class Decisions:
  """The step-based settings of a run (config.*_every_steps, the cooldown and the budget)."""
  num_train_steps: int
  log_every_steps: int
  eval_every_steps: int
  checkpoint_every_steps: int
  cooldown_fraction: float = 0.0
  time_budget_minutes: float = 0.0
  warmup_steps: int = 0

  @classmethod
  def of(cls, cfg) -> Decisions:
    """The decisions of a TrainConfig's loop."""
    return cls(cfg.num_train_steps, cfg.log_every_steps, cfg.eval_every_steps,
               cfg.checkpoint_every_steps, cfg.optimizer.cooldown_fraction,
               cfg.time_budget_minutes, cfg.optimizer.warmup_steps)

  def start(self, history: list[dict], start_step: int, budget_spent: bool) -> Start:
    """Before the first step of a run resumed at `start_step` (0: a new run)."""
    return Start(validation_pending(history, start_step),
                 budget_spent and start_step < self.num_train_steps)

  def asks_wall_clock(self, step: int, clock_active: bool) -> bool:
    """Whether the wall-clock intervals are asked after `step`: at logging steps only, so that
    every host asks (and agrees) at the same step."""
    return clock_active and step % self.log_every_steps == 0

  def actions(self, step: int, preempted: bool, budget_spent: bool, due_eval: bool = False,
              due_save: bool = False) -> Actions:
    """After the update of `step`: `preempted` (SIGTERM noticed), `budget_spent` (the time
    budget's clock), `due_eval`/`due_save` (the wall-clock intervals, when asked)."""
    out_of_time = budget_spent and step < self.num_train_steps
    last = step == self.num_train_steps or preempted or out_of_time
    save = step % self.checkpoint_every_steps == 0 or last or due_save
    return Actions(log=step % self.log_every_steps == 0 or save,
                   validate=(step % self.eval_every_steps == 0 or last or due_eval)
                   and not preempted,
                   save=save, last=last, out_of_time=out_of_time)

  def learning_rate_scale(self, step: int, minutes: float,
                          resumed: tuple[int, float] = (0, 1.0)) -> float:
    """The cooldown factor on the learning rate of update `step` (1-based) after `minutes` of
    training: see cooldown_scale. `resumed`: (the step this run resumed at, the factor logged
    last before it). A run resumed with a larger time budget or more steps after its cooldown
    began would jump from that factor up to the new schedule's; instead the factor ramps
    linearly from it to the schedule's over `warmup_steps` updates (at least 1), as training
    warmed up at its start, then follows the schedule. A factor already at or above the
    schedule's (a plain resume) follows the schedule at once."""
    target = cooldown_scale(self.cooldown_fraction, step, self.num_train_steps, minutes,
                            self.time_budget_minutes)
    start_step, start_factor = resumed
    if start_factor >= target:
      return target
    ramp = min(1.0, (step - start_step) / max(self.warmup_steps, 1))
    return start_factor + (target - start_factor) * ramp


def cooldown_scale(fraction: float, step: int, num_steps: int, minutes: float = 0.0,
                   budget_minutes: float = 0.0) -> float:
  """The factor on the learning rate of update `step` (1-based): 1, then linear to 0 over the
  last `fraction` of training. Training ends at `num_steps` or, with a time budget, when
  `minutes` reach `budget_minutes`, whichever comes first, so a run that the budget stops
  ends cooled down like one that reaches its last step. `fraction` 0: always 1."""
  if fraction <= 0:
    return 1.0
  left = (num_steps - step + 1) / num_steps
  if budget_minutes > 0:
    left = min(left, max(budget_minutes - minutes, 0.0) / budget_minutes)
  return min(1.0, left / fraction)


class EarlyStopping:
  """Stops when validation BLEU has not improved for `patience` evaluations (0: never)."""

  def __init__(self, patience: int, history: list[float]):
    self.patience, self.best, self.bad = patience, float("-inf"), 0
    for bleu in history:  # a resumed run continues the count where it stopped
      self.update(bleu)

  def update(self, bleu: float) -> bool:
    if bleu > self.best:
      self.best, self.bad = bleu, 0
    else:
      self.bad += 1
    return self.patience > 0 and self.bad >= self.patience


def validation_pending(history: list[dict], step: int) -> bool:
  """Whether the validation of `step` was cut short and not done since."""
  at_step = [r for r in history if r["step"] == step]
  return (any(VALIDATION_CANCELLED in r for r in at_step)
          and not any("eval/bleu" in r for r in at_step))


def last_logged(records: list[dict], key: str, default: float) -> float:
  """The newest value of `key` in metrics `records` (`default` if none has it)."""
  values = [r[key] for r in records if key in r]
  return values[-1] if values else default


def bleu_history(records: list[dict]) -> list[float]:
  """The validation BLEU of each validation in `records`, in order."""
  return [r["eval/bleu"] for r in records if "eval/bleu" in r]


FILTER_COUNTS = (("data/filtered_empty", "empty"), ("data/filtered_too_long", "too_long"),
                 ("data/pairs_kept", "kept"))


def carried_counts(history: list[dict], corpus_names: list[str]
                   ) -> tuple[dict[str, int], dict[str, list[int]]]:
  """The data counts a resumed run goes on from: those logged at its checkpoint's step (the
  newest record of each), as (filter field -> count, "pairs"/"tokens" -> a count per corpus)."""
  fields = {field: int(last_logged(history, key, 0)) for key, field in FILTER_COUNTS}
  corpus = {kind: [int(last_logged(history, f"data/corpus/{name}/{kind}", 0))
                   for name in corpus_names] for kind in ("pairs", "tokens")}
  return fields, corpus
