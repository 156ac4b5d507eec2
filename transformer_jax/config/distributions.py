"""A sweep's search ranges: `choice`, `uniform`, `loguniform` and `integer` (what a
`configs/sweeps/*.py` spec puts in its search space), and the error a bad spec raises."""

from __future__ import annotations

import dataclasses
from typing import Union

from transformer_jax.errors import ConfigError

Scalar = Union[None, bool, int, float, str]  # what Optuna stores as a categorical value


class SweepError(ConfigError):
  """A sweep spec is invalid; the message names the key and what is wrong."""


@dataclasses.dataclass(frozen=True)
class Choice:
  """One of `values` (the grid sampler tries each)."""
  values: tuple

  def grid(self) -> tuple:
    return self.values

  def examples(self) -> tuple:
    return self.values

  def contains(self, value) -> bool:
    return value in self.values


@dataclasses.dataclass(frozen=True)
class Uniform:
  """A float in [low, high]; `log` samples uniformly in log space (log-uniform)."""
  low: float
  high: float
  log: bool = False

  def grid(self) -> tuple:
    raise SweepError("is a continuous range; a grid sweep needs choice(...) or integer(...)")

  def examples(self) -> tuple:
    return (self.low, self.high)

  def contains(self, value) -> bool:
    return self.low <= value <= self.high


@dataclasses.dataclass(frozen=True)
class Integer:
  """An integer in [low, high] (both included) in steps of `step`, or log-uniform."""
  low: int
  high: int
  step: int = 1
  log: bool = False

  def grid(self) -> tuple:
    if self.log:
      raise SweepError("is a log-scaled range; a grid sweep needs choice(...) or "
                       "integer(low, high, step)")
    return tuple(range(self.low, self.high + 1, self.step))

  def examples(self) -> tuple:
    return (self.low, self.high)

  def contains(self, value) -> bool:
    return self.low <= value <= self.high


Distribution = Union[Choice, Uniform, Integer]


def choice(*values: Scalar) -> Choice:
  return Choice(tuple(values))


def uniform(low: float, high: float) -> Uniform:
  return Uniform(float(low), float(high))


def loguniform(low: float, high: float) -> Uniform:
  return Uniform(float(low), float(high), log=True)


def integer(low: int, high: int, step: int = 1, log: bool = False) -> Integer:
  return Integer(low, high, step, log)
