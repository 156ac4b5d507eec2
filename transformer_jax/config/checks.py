"""Checking config values against a dataclass's fields: unknown keys (with the closest known
one as a suggestion), missing keys, and types. Below the sections, which use it for their
nested parts (`config.data.corpora`, `config.data.cleaning`)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing

from transformer_jax.errors import ConfigError


def did_you_mean(key: str, known) -> str:
  """' (did you mean X?)' for the known keys closest to a misspelt one (up to three), else
  the list of known keys."""
  close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
  if close:
    return f" (did you mean {' or '.join(filter(None, [', '.join(close[:-1]), close[-1]]))}?)"
  return f"; known keys: {', '.join(sorted(known))}"


def check_type(where: str, value, expected):
  """`value` as a field of type `expected` takes it (an int as a float, a list as a tuple); a
  ConfigError naming `where` for another type, or for a float (also a tuple's) that is NaN or
  infinite: no setting means either, and every range check is false for NaN."""
  origin = typing.get_origin(expected) or expected
  for number in value if isinstance(value, (tuple, list)) else (value,):
    if isinstance(number, float) and not math.isfinite(number):
      raise ConfigError(f"{where}={value!r} is not a finite number")
  if expected is float and isinstance(value, int) and not isinstance(value, bool):
    return float(value)
  if origin is tuple and isinstance(value, list):
    value = tuple(value)
  if isinstance(origin, type) and not isinstance(value, origin):
    raise ConfigError(f"{where}={value!r} has type {type(value).__name__}, "
                      f"expected {getattr(expected, '__name__', expected)}")
  if expected is int and isinstance(value, bool):
    raise ConfigError(f"{where}={value!r} is a bool, expected int")
  return value


def checked_kwargs(cls, values: dict, prefix: str, skip=()) -> dict:
  """The keyword arguments for dataclass `cls`: each key a field, each field given (unless it
  has a default), each value of the field's type. `skip` names keys handled elsewhere."""
  hints = typing.get_type_hints(cls)
  fields = {f.name: f for f in dataclasses.fields(cls)}
  for key in values:
    if key not in fields:
      raise ConfigError(f"unknown key {prefix}{key}{did_you_mean(key, fields)}")
  missing = [name for name, f in fields.items() if name not in values and name not in skip
             and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
  if missing:
    raise ConfigError(f"missing key(s) {', '.join(prefix + k for k in missing)} "
                      "(the shipped configs/default.py sets every key)")
  return {key: check_type(prefix + key, value, hints[key])
          for key, value in values.items() if key not in skip}


def check_positive(section: str, obj, names):
  for name in names:
    if getattr(obj, name) <= 0:
      raise ConfigError(f"config.{section}.{name}={getattr(obj, name)} must be positive")


def check_rate(section: str, obj, names):
  for name in names:
    if not 0.0 <= getattr(obj, name) < 1.0:
      raise ConfigError(f"config.{section}.{name}={getattr(obj, name)} must be in [0, 1)")


def check_choice(where: str, value, choices):
  if value not in choices:
    raise ConfigError(f"{where}={value!r}: expected one of {', '.join(map(repr, choices))}")
