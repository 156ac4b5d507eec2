"""From an `ml_collections.ConfigDict` (or `key=value` text) to the typed sections, failing fast.

Every key must be a field of its section and every field must be given (the config files hold
the values); a value must have the field's type. Errors name the key, and a misspelt one gets
the closest known key as a suggestion.
"""

from __future__ import annotations

import ast
import dataclasses
import typing

import ml_collections

from transformer_jax.config.checks import check_type, checked_kwargs, did_you_mean  # noqa: F401 (API)
from transformer_jax.config.sections import SECTIONS, TrainConfig
from transformer_jax.errors import ConfigError


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
    changes[key] = check_type(f"--{flag} {key}", parse_value(text, hints[key],
                                                             f"--{flag}={item!r}"), hints[key])
  return dataclasses.replace(section, **changes)
