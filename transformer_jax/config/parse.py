"""From an `ml_collections.ConfigDict` (or `key=value` text) to the typed sections, failing fast.

Every key must be a field of its section and every field must be given (the config files hold
the values); a value must have the field's type. Errors name the key, and a misspelt one gets
the closest known key as a suggestion.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import typing

import ml_collections

from transformer_jax.config.sections import SECTIONS, TrainConfig
from transformer_jax.errors import ConfigError


def did_you_mean(key: str, known) -> str:
  """' (did you mean X?)' for the known keys closest to a misspelt one (up to three), else
  the list of known keys."""
  close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
  if close:
    return f" (did you mean {' or '.join(filter(None, [', '.join(close[:-1]), close[-1]]))}?)"
  return f"; known keys: {', '.join(sorted(known))}"


def _check_type(where: str, value, expected):
  origin = typing.get_origin(expected) or expected
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
  return {key: _check_type(prefix + key, value, hints[key])
          for key, value in values.items() if key not in skip}


def from_config_dict(config: ml_collections.ConfigDict) -> TrainConfig:
  """Validated dataclasses from a ConfigDict; raises ConfigError naming the offending key."""
  values = config.to_dict()
  sections = {}
  for name, cls in SECTIONS.items():
    if name not in values:
      raise ConfigError(f"config has no section config.{name}")
    if not isinstance(values[name], dict):
      raise ConfigError(f"config.{name} must be a section (ConfigDict), got "
                        f"{type(values[name]).__name__}")
    sections[name] = cls(**checked_kwargs(cls, values[name], f"config.{name}."))
  run_kwargs = checked_kwargs(TrainConfig, values, "config.", skip=SECTIONS)
  return TrainConfig(**sections, **run_kwargs)


def parse_value(text: str, kind, where: str):
  """The value of type `kind` (bool, int, float, str or a tuple) that command-line `text`
  spells; a ConfigError naming `where` when it spells none."""
  origin = typing.get_origin(kind) or kind
  try:
    if origin is bool:
      if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError
      return text.lower() in ("true", "1", "yes")
    if origin in (int, float):
      return origin(text)
    if origin is tuple:
      value = ast.literal_eval(text)
      if not isinstance(value, (tuple, list)):
        raise ValueError
      return tuple(value)
    if origin is str:
      return text
    if origin is type(None):  # (a field set to None: a Python literal, else the text)
      try:
        return ast.literal_eval(text)
      except (ValueError, SyntaxError):
        return text
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    name = getattr(origin, "__name__", str(kind))
    raise ConfigError(f"{where}: {text!r} is not a valid {name}") from None


def replace_from_text(section, items: list[str], flag: str):
  """`section` (a dataclass) with `key=value` items applied, each parsed by its field's type
  (the `--decode beam_size=5` flags)."""
  hints = typing.get_type_hints(type(section))
  changes = {}
  for item in items:
    key, sep, text = item.partition("=")
    if not sep:
      raise ConfigError(f"--{flag}={item!r}: expected key=value, key one of {', '.join(hints)}")
    if key not in hints:
      raise ConfigError(f"--{flag}={item!r}: unknown key {key!r}{did_you_mean(key, hints)}")
    changes[key] = parse_value(text, hints[key], f"--{flag}={item!r}")
  return dataclasses.replace(section, **changes)
