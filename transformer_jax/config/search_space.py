"""Sweep specs: a search space over config fields, an objective, a budget and a sampler.

A spec is an ml_collections config file (`configs/sweeps/*.py`) whose `get_config()` returns
`new_spec()` filled in; its search space mirrors the training config's sections:

  sweep.search_space = {"optimizer": {"learning_rate": loguniform(1e-4, 1e-2),
                                      "warmup_steps": choice(100, 400)}}

Everything is checked against the base training config before any trial starts
(`load_spec`): each swept field exists, every value it can take has the field's type, and
every grid point (for grid sweeps) passes the training config's own validation.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from typing import Any

import ml_collections

from transformer_jax.config.distributions import (  # noqa: F401 (specs import them here)
  Choice,
  Distribution,
  Integer,
  SweepError,
  Uniform,
  choice,
  integer,
  loguniform,
  uniform,
)
from transformer_jax.config.files import find_field
from transformer_jax.config.parse import checked_kwargs, from_config_dict
from transformer_jax.config.population import MEMBER_KEYS, MEMBER_PATHS, SWITCHES
from transformer_jax.errors import ConfigError

# Metrics the training run logs that can be optimised, and their natural direction.
OBJECTIVES = {"eval/bleu": "maximize", "eval/chrf": "maximize", "eval/loss": "minimize",
              "test/bleu": "maximize", "test/chrf": "maximize"}
SAMPLERS = ("grid", "random", "tpe")
PRUNERS = ("median", "hyperband", "successive_halving", "none")


@dataclasses.dataclass(frozen=True)
class SweepSpec:
  """A validated sweep; `search_space` and `fixed` are flat, keyed by dotted config field."""
  search_space: dict[str, Distribution]
  fixed: dict[str, Any]
  start_points: tuple = ()       # the first trials' values (dicts of swept fields; a field left
                                 # out is sampled), e.g. the recipe to beat; part of num_trials
  objective: str = "eval/bleu"   # a metric the run logs (OBJECTIVES)
  direction: str = ""            # "maximize" | "minimize"; "" = the objective's natural one
  reduce: str = "last"           # objective of a run: its "last" evaluation, or the "best"
  sampler: str = "tpe"           # "grid" | "random" | "tpe"
  num_trials: int = 0            # trial budget; 0 = the whole grid (grid sampler only)
  seed: int = 0                  # sampler seed (trial i samples with seed + i)
  pruner: str = "median"         # stops clearly losing trials early; "none" = off
  pruner_startup_trials: int = 2  # finished trials before any pruning
  pruner_warmup_steps: int = 0    # training steps before a trial can be pruned
  max_retries: int = 2           # reruns of a trial interrupted by a killed worker
  population: int = 1            # K > 1: a worker trains K trials at once as one population
                                 # (config.population); swept keys a member cannot vary
                                 # (`shared_paths`) are drawn once per population

  @property
  def intermediate_metric(self) -> str:
    """What trials report while they train (for pruning): the validation form of the
    objective (eval/bleu for test/bleu)."""
    return "eval/" + self.objective.split("/", 1)[1]

  @property
  def grid_points(self) -> list[dict[str, Any]]:
    names = list(self.search_space)
    values = [self.search_space[n].grid() for n in names]
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]

  @property
  def finite(self) -> bool:
    """Whether the search space is a list of points (every range a grid can enumerate)."""
    try:
      return all(dist.grid() is not None for dist in self.search_space.values())
    except SweepError:
      return False

  @property
  def member_paths(self) -> tuple[str, ...]:
    """The swept keys each member of a population takes its own value of (MEMBER_KEYS,
    except a switch, grad_clip_norm or ema_decay, whose range holds 0: off is another
    program)."""
    return tuple(path for path, dist in self.search_space.items()
                 if path in MEMBER_PATHS
                 and not (MEMBER_PATHS[path] in SWITCHES and dist.contains(0)))

  @property
  def shared_paths(self) -> tuple[str, ...]:
    """The swept keys the members of one population share (they change a shape or the
    program): the first member's draw, or a grid's points grouped by them."""
    return tuple(path for path in self.search_space if path not in self.member_paths)

  def queued_points(self) -> list[dict[str, Any]]:
    """The trials queued when the study is created, in order, each the values it fixes (the
    rest are sampled when a worker claims it): the grid's points; for a random sweep of a
    finite space, distinct grid points in a seeded random order (a start point first, as the
    first point that has its values: no point twice); else the start points, then empty
    points to sample."""
    if self.sampler == "grid":
      return self.grid_points
    if self.sampler == "random" and self.finite:
      order = self.grid_points
      random.Random(self.seed).shuffle(order)
      queued = []
      for start in self.start_points:  # (the first point it matches: its missing fields drawn)
        queued.append(next((p for p in order if p not in queued
                            and all(p[k] == v for k, v in start.items())), start))
      return queued + [p for p in order if p not in queued][:self.num_trials - len(queued)]
    return [*self.start_points, *[{}] * (self.num_trials - len(self.start_points))]

  def to_json(self) -> dict:
    """What identifies the sweep (a study resumed with another spec is refused)."""
    return {"search_space": {k: {"type": type(v).__name__, **dataclasses.asdict(v)}
                             for k, v in self.search_space.items()},
            "fixed": self.fixed, "objective": self.objective, "direction": self.direction,
            "reduce": self.reduce, "sampler": self.sampler, "num_trials": self.num_trials,
            "seed": self.seed, "start_points": [dict(p) for p in self.start_points],
            **({"population": self.population} if self.population > 1 else {})}


def new_spec() -> ml_collections.ConfigDict:
  """The spec a `configs/sweeps/*.py` file starts from (defaults of SweepSpec)."""
  spec = ml_collections.ConfigDict()
  for f in dataclasses.fields(SweepSpec):
    if f.name not in ("search_space", "fixed", "start_points"):
      spec[f.name] = f.default
  spec.search_space = ml_collections.ConfigDict()
  spec.fixed = ml_collections.ConfigDict()
  spec.start_points = ()
  return spec


def _flatten(tree, prefix: str = "") -> dict[str, Any]:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, (dict, ml_collections.ConfigDict)):
      flat.update(_flatten(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = value
  return flat


def _config_field(base: ml_collections.ConfigDict, path: str, where: str):
  """The current value of `path` in the base config, or a SweepError naming it."""
  try:
    parent, key = find_field(base, path, where)
  except ConfigError as e:
    raise SweepError(f"{e} (in the training config)") from None
  if isinstance(parent[key], ml_collections.ConfigDict):
    raise SweepError(f"{where}: config.{path} is a section, not a field")
  return parent[key]


def with_overrides(base: ml_collections.ConfigDict, overrides: dict[str, Any]
                   ) -> ml_collections.ConfigDict:
  """A copy of `base` with dotted-key overrides applied (type-checked by ConfigDict)."""
  cfg = ml_collections.ConfigDict(base.to_dict())
  for path, value in overrides.items():
    parent, key = find_field(cfg, path, path)
    parent[key] = value
  return cfg


def _check_value(base, path: str, value, where: str):
  current = _config_field(base, path, where)
  if value is not None and not isinstance(value, (bool, int, float, str)):
    raise SweepError(f"{where}: value {value!r} has type {type(value).__name__}; swept values "
                     "must be bool, int, float, str or None")
  if current is not None and value is not None:
    expected = type(current)
    ok = (isinstance(value, expected) and not (expected is int and isinstance(value, bool))
          or expected is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
      raise SweepError(f"{where}: value {value!r} has type {type(value).__name__}, but "
                       f"config.{path} is {expected.__name__} (now {current!r})")


def _validate_training_config(base, overrides: dict[str, Any], where: str):
  try:
    from_config_dict(with_overrides(base, overrides))
  except (ConfigError, TypeError, ValueError) as e:
    raise SweepError(f"{where}: the training config would be invalid: {e}") from e


def load_spec(spec: ml_collections.ConfigDict, base: ml_collections.ConfigDict) -> SweepSpec:
  """Validates a spec against the base training config; raises SweepError naming the key."""
  values = spec.to_dict()
  search = _flatten(values.pop("search_space", {}) or {})
  fixed = _flatten(values.pop("fixed", {}) or {})
  starts = values.pop("start_points", ()) or ()
  try:
    values = checked_kwargs(SweepSpec, values, "sweep.",
                            skip=("search_space", "fixed", "start_points"))
  except ConfigError as e:
    raise SweepError(str(e)) from None
  _check_population_keys(values.get("population", 1), search, fixed)
  if not search:
    raise SweepError("sweep.search_space is empty: name at least one config field to sweep, "
                     "e.g. sweep.search_space = {'optimizer': {'learning_rate': "
                     "loguniform(1e-4, 1e-2)}}")

  for path, dist in search.items():
    where = f"sweep.search_space.{path}"
    if not isinstance(dist, (Choice, Uniform, Integer)):
      raise SweepError(f"{where}={dist!r} is a single value, not a search range; use "
                       "choice(...), uniform(...), loguniform(...) or integer(...) (fixed "
                       "values go in sweep.fixed)")
    _check_distribution(dist, where)
    for value in dist.examples():
      _check_value(base, path, value, where)
  for path, value in fixed.items():
    _check_value(base, path, value, f"sweep.fixed.{path}")
  overlap = sorted(set(search) & set(fixed))
  if overlap:
    raise SweepError(f"sweep.fixed and sweep.search_space both set {', '.join(overlap)}")

  if "num_train_steps" not in search and not with_overrides(base, fixed).num_train_steps:
    raise SweepError("config.num_train_steps=0 (a length planned from the machine's speed): "
                     "each trial would plan its own from the load it met, so trials would not "
                     "compare; set sweep.fixed.num_train_steps (with a time budget if trials "
                     "should end on the clock)")
  starts = _start_points(starts, search, base, fixed)
  result = SweepSpec(search_space=search, fixed=fixed, start_points=starts, **values)
  _check_settings(result, base)
  if result.sampler == "grid" and starts:
    raise SweepError("sweep.start_points: a grid sweep runs every point already")
  if len(starts) > result.num_trials:
    raise SweepError(f"sweep.start_points holds {len(starts)} points but sweep.num_trials="
                     f"{result.num_trials}: the start points are part of the budget")
  # Every configuration a trial can get passes the training config's own validation.
  if result.sampler == "grid":
    for point in result.grid_points:
      _validate_training_config(base, {**fixed, **point}, f"grid point {point}")
  else:
    for path, dist in search.items():
      for value in dist.examples():
        _validate_training_config(base, {**fixed, path: value},
                                  f"sweep.search_space.{path}={value!r}")
  if not result.direction:
    result = dataclasses.replace(result, direction=OBJECTIVES[result.objective])
  return result


def _start_points(starts, search: dict, base, fixed: dict) -> tuple:
  """The start points as flat dicts, each value one its distribution can take and each point
  a valid training config."""
  if isinstance(starts, (dict, ml_collections.ConfigDict)):
    starts = (starts,)
  out = []
  for i, point in enumerate(starts):
    where = f"sweep.start_points[{i}]"
    if not isinstance(point, (dict, ml_collections.ConfigDict)):
      raise SweepError(f"{where} must be a dict of swept fields, got {type(point).__name__}")
    point = _flatten(point)
    for path, value in point.items():
      if path not in search:
        raise SweepError(f"{where}: {path} is not in sweep.search_space")
      dist, at = search[path], f"{where}.{path}"
      _check_value(base, path, value, at)
      if not dist.contains(value):
        raise SweepError(f"{at}={value!r} is outside its search range {dist}")
    _validate_training_config(base, {**fixed, **point}, where)
    out.append(point)
  return tuple(out)


def _check_distribution(dist: Distribution, where: str):
  if isinstance(dist, Choice):
    if not dist.values:
      raise SweepError(f"{where}: choice() needs at least one value")
    if len(set(map(repr, dist.values))) != len(dist.values):
      raise SweepError(f"{where}: choice{dist.values} repeats a value")
    return
  if isinstance(dist, Integer) and not all(
      isinstance(v, int) and not isinstance(v, bool) for v in (dist.low, dist.high, dist.step)):
    raise SweepError(f"{where}: integer() bounds and step must be ints, got {dist}")
  if not (math.isfinite(dist.low) and math.isfinite(dist.high)) or dist.low >= dist.high:
    raise SweepError(f"{where}: the range needs low < high, got low={dist.low}, "
                     f"high={dist.high}")
  if dist.log and dist.low <= 0:
    raise SweepError(f"{where}: a log-scaled range needs low > 0, got low={dist.low}")
  if isinstance(dist, Integer) and dist.step < 1:
    raise SweepError(f"{where}: integer() step must be >= 1, got {dist.step}")


def _check_settings(spec: SweepSpec, base: ml_collections.ConfigDict):
  if spec.objective not in OBJECTIVES:
    raise SweepError(f"sweep.objective={spec.objective!r} is not a logged metric; choose one "
                     f"of {', '.join(OBJECTIVES)}")
  if spec.objective.startswith("test/") and not base.data.test_split:
    raise SweepError(f"sweep.objective={spec.objective!r} needs a test split, but the "
                     "training config has config.data.test_split=''")
  for key, value, allowed in (("direction", spec.direction, ("", "maximize", "minimize")),
                              ("reduce", spec.reduce, ("last", "best")),
                              ("sampler", spec.sampler, SAMPLERS),
                              ("pruner", spec.pruner, PRUNERS)):
    if value not in allowed:
      raise SweepError(f"sweep.{key}={value!r}; choose one of "
                       f"{', '.join(repr(a) for a in allowed)}")
  if spec.sampler == "grid":
    for path, dist in spec.search_space.items():
      try:
        dist.grid()
      except SweepError as e:
        raise SweepError(f"sweep.search_space.{path} {e}") from None
    size = len(spec.grid_points)
    if spec.num_trials not in (0, size):
      raise SweepError(f"sweep.num_trials={spec.num_trials} but the grid has {size} points; "
                       "use 0 (the whole grid) or change the search space")
  elif spec.num_trials < 1:
    raise SweepError(f"sweep.num_trials={spec.num_trials}: a {spec.sampler} sweep needs a "
                     "budget >= 1")
  elif spec.sampler == "random" and spec.finite and spec.num_trials > len(spec.grid_points):
    raise SweepError(f"sweep.num_trials={spec.num_trials} but the search space has "
                     f"{len(spec.grid_points)} points (a random sweep runs each at most "
                     "once): lower it, or use sweep.sampler='grid'")
  for key in ("pruner_startup_trials", "pruner_warmup_steps", "max_retries"):
    if getattr(spec, key) < 0:
      raise SweepError(f"sweep.{key}={getattr(spec, key)} must be >= 0")
  if spec.population < 1:
    raise SweepError(f"sweep.population={spec.population} must be >= 1 (1: a run per trial)")
  if spec.population > 1:
    _check_population(spec, base)


def _check_population(spec: SweepSpec, base: ml_collections.ConfigDict):
  """A population sweep makes the populations (the base config is none) of members that
  differ in a swept key."""
  if not spec.member_paths:
    raise SweepError(f"sweep.population={spec.population}, but no swept key can differ "
                     f"between members (the shared ones: {', '.join(spec.shared_paths)}): "
                     "sweep one of learning rate, warmup, Adam's constants, weight decay, "
                     "dropout, label smoothing or seed, or set sweep.population=1")
  pop = base.get("population") or {}
  if any(pop.get(key) for key in (*MEMBER_KEYS, "seeds")):
    raise SweepError(f"sweep.population={spec.population}, but the training config is a "
                     "population already (config.population); the sweep makes the "
                     "populations: leave config.population empty")


def _check_population_keys(population: int, search: dict, fixed: dict):
  """A population sweep gives the members their values: the spec may set the population's
  program only."""
  if population <= 1:
    return
  for where, paths in (("sweep.search_space", search), ("sweep.fixed", fixed)):
    taken = sorted(p for p in paths if p.startswith("population.")
                   and p != "population.program")
    if taken:
      raise SweepError(f"{where}.{taken[0]}: with sweep.population the sweep gives each "
                       "member its values; sweep the config key itself (e.g. "
                       "optimizer.learning_rate)")


# Config fields the trained tokenizer depends on.
TOKENIZER_FIELDS = ("seed", "model.vocab_size", "data.dataset", "data.data_dir",
                    "data.source_lang", "data.target_lang", "data.train_split",
                    "data.tokenizer_path", "data.tokenizer_max_sentences",
                    "data.tokenizer_max_chars")


def shares_tokenizer(spec: SweepSpec, base: ml_collections.ConfigDict) -> bool:
  """Whether every trial would train the same tokenizer (so they can share one file)."""
  changed = set(spec.search_space) | set(spec.fixed)
  return not base.data.tokenizer_path and not changed & set(TOKENIZER_FIELDS)


def format_override(base: ml_collections.ConfigDict, path: str, value) -> str:
  """`--config.<path>=<value>` as config_flags parses it back to the field's type."""
  current = _config_field(base, path, path)
  if isinstance(value, bool):
    text = "true" if value else "false"
  elif isinstance(current, float) and isinstance(value, (int, float)):
    text = repr(float(value))
  else:
    text = str(value)
  return f"--config.{path}={text}"
