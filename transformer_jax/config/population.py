"""`config.population`: K members of one config trained as one program on the same batches,
differing in values that change no array's shape (`training.population` trains them). Nothing
heavy is imported here."""

from __future__ import annotations

import dataclasses
import numbers

from transformer_jax.config.fields import declared
from transformer_jax.errors import ConfigError


def is_static(value) -> bool:
  """Whether a config value is a number known while a program is traced; a population's
  per-member values (MEMBER_KEYS) are traced arrays instead, and code that branches on a
  value (a rate of 0 skips dropout) must take such a value as not 0."""
  return isinstance(value, numbers.Number)


# The keys a population's members may differ in (config.population.<key>): values that change
# no array's shape, so that K members train as one program. Each is the config key it sets.
MEMBER_KEYS = {
    "seed": "seed", "learning_rate": "optimizer.learning_rate",
    "warmup_steps": "optimizer.warmup_steps", "b1": "optimizer.b1", "b2": "optimizer.b2",
    "eps": "optimizer.eps", "weight_decay": "optimizer.weight_decay",
    "grad_clip_norm": "optimizer.grad_clip_norm", "ema_decay": "optimizer.ema_decay",
    "label_smoothing": "label_smoothing", "dropout_rate": "model.dropout_rate",
    "attention_dropout_rate": "model.attention_dropout_rate",
    "ffn_dropout_rate": "model.ffn_dropout_rate"}
MEMBER_PATHS = {path: key for key, path in MEMBER_KEYS.items()}  # config key -> member key
# Member keys whose 0 switches a part of the state or the optimizer off: another program, so
# all members > 0 or all 0.
SWITCHES = {"grad_clip_norm": "clipping", "ema_decay": "the parameters' moving average"}


def _member_key():
  """A key of the members' values: () (the run's own value) in runs from before populations."""
  return declared(before=())


@dataclasses.dataclass(frozen=True)
class PopulationConfig:
  """K members trained as one program on the same batches (`config.population`): member i
  takes the i-th value of every key given here, the run's own value of every other key. () =
  the run's value for every member; K = the length of the tuples given (all equal)."""
  seeds: int = declared(before=0)                 # N > 0: N members, member i with seed
                                                  # config.seed + i (with the tuples below, their
                                                  # length must be N; `seed` not given)
  seed: tuple = _member_key()                     # each member's seed (its parameters and dropout)
  learning_rate: tuple = _member_key()            # config.optimizer.learning_rate
  warmup_steps: tuple = _member_key()             # config.optimizer.warmup_steps
  b1: tuple = _member_key()                       # config.optimizer.b1
  b2: tuple = _member_key()                       # config.optimizer.b2
  eps: tuple = _member_key()                      # config.optimizer.eps
  weight_decay: tuple = _member_key()             # config.optimizer.weight_decay
  grad_clip_norm: tuple = _member_key()           # config.optimizer.grad_clip_norm (all > 0,
                                                  # or all 0)
  ema_decay: tuple = _member_key()                # config.optimizer.ema_decay (all > 0, or all 0)
  label_smoothing: tuple = _member_key()          # config.label_smoothing
  dropout_rate: tuple = _member_key()             # config.model.dropout_rate
  attention_dropout_rate: tuple = _member_key()   # config.model.attention_dropout_rate
  ffn_dropout_rate: tuple = _member_key()         # config.model.ffn_dropout_rate
  program: str = declared(before="auto")          # how the members' steps make one program:
                                                  # "vmapped" (the member axis a batch axis),
                                                  # "unrolled" (K copies side by side), "auto"
                                                  # (unrolled on CPU, vmapped on GPUs and TPUs)

  def __post_init__(self):
    for key in MEMBER_KEYS:
      object.__setattr__(self, key, tuple(getattr(self, key)))
    if self.program not in ("auto", "vmapped", "unrolled"):
      raise ConfigError(f"config.population.program={self.program!r}: expected 'auto', "
                        "'vmapped' or 'unrolled'")
    if self.seeds < 0:
      raise ConfigError(f"config.population.seeds={self.seeds} must be >= 0 (0: no seeds)")
    given = {key: len(getattr(self, key)) for key in MEMBER_KEYS if getattr(self, key)}
    if self.seeds and "seed" in given:
      raise ConfigError("config.population: give seeds=N or seed=(...), not both")
    sizes = set(given.values()) | ({self.seeds} if self.seeds else set())
    if len(sizes) > 1:
      raise ConfigError("config.population: the members' values differ in number ("
                        + ", ".join(f"{k}: {n}" for k, n in given.items())
                        + (f", seeds={self.seeds}" if self.seeds else "") + "): give each "
                        "key one value per member")

  @property
  def size(self) -> int:
    """K, the number of members; 0 for a run that is not a population."""
    return self.seeds or max((len(getattr(self, key)) for key in MEMBER_KEYS), default=0)
