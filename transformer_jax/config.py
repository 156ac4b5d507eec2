"""Turns an `ml_collections.ConfigDict` into validated, typed dataclasses, failing fast.

Each section maps one-to-one onto a dataclass (`config.model` -> `ModelConfig`, ...), so a
misspelt or ill-typed key is an error naming the key, before anything is built or compiled.
"""

from __future__ import annotations

import dataclasses
import typing

import ml_collections

from transformer_jax.data import DataConfig
from transformer_jax.decode import DecodeConfig
from transformer_jax.model import ModelConfig
from transformer_jax.optimizer import OptimizerConfig
from transformer_jax.sharding import ParallelismConfig


class ConfigError(ValueError):
  """A config key is unknown, missing or of the wrong type; the message names it."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A whole run; `config.<section>.<key>` for sections, `config.<key>` for run-level keys."""
  model: ModelConfig
  data: DataConfig
  optimizer: OptimizerConfig
  decode: DecodeConfig
  parallelism: ParallelismConfig
  seed: int = 0                     # parameters, dropout and data order
  num_train_steps: int = 1000
  log_every_steps: int = 50         # train metrics and the progress line
  eval_every_steps: int = 1000      # validation loss + BLEU (and at the last step)
  checkpoint_every_steps: int = 1000  # (and at the last step)
  max_checkpoints_to_keep: int = 3
  label_smoothing: float = 0.1
  eval_max_sentences: int = 0       # validation sentences decoded for BLEU; 0 = all
  early_stopping_patience: int = 0  # stop after this many evals without a better BLEU; 0 = off
  num_micro_batches: int = 1        # gradient accumulation: the batch in this many pieces
  nonfinite_updates: str = "stop"   # a NaN/Inf loss or gradient: "stop" the run, or "skip" it

  def __post_init__(self):
    for name in ("num_train_steps", "log_every_steps", "eval_every_steps",
                 "checkpoint_every_steps", "max_checkpoints_to_keep", "num_micro_batches"):
      if getattr(self, name) < 1:
        raise ConfigError(f"config.{name}={getattr(self, name)} must be >= 1")
    if self.nonfinite_updates not in ("stop", "skip"):
      raise ConfigError(f"config.nonfinite_updates={self.nonfinite_updates!r} must be 'stop' "
                        "or 'skip'")
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ConfigError(f"config.label_smoothing={self.label_smoothing} must be in [0, 1)")
    if self.data.batch_size % self.num_micro_batches:
      raise ConfigError(f"config.data.batch_size={self.data.batch_size} is not divisible by "
                        f"config.num_micro_batches={self.num_micro_batches}")
    if self.model.max_len < max(self.data.max_source_length, self.data.max_target_length):
      raise ConfigError(
          f"config.model.max_len={self.model.max_len} is shorter than the data's length limit "
          f"(max_source_length={self.data.max_source_length}, "
          f"max_target_length={self.data.max_target_length})")
    if self.decode.max_length > self.model.max_len:
      raise ConfigError(f"config.decode.max_length={self.decode.max_length} exceeds "
                        f"config.model.max_len={self.model.max_len}")


SECTIONS = {"model": ModelConfig, "data": DataConfig, "optimizer": OptimizerConfig,
            "decode": DecodeConfig, "parallelism": ParallelismConfig}


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


def checked_kwargs(cls, values: dict, prefix: str) -> dict:
  """The keyword arguments for `cls`, each key known and each value of the declared type."""
  hints = typing.get_type_hints(cls)
  fields = {f.name for f in dataclasses.fields(cls)}
  unknown = sorted(set(values) - fields)
  if unknown:
    raise ConfigError(f"unknown key(s) {', '.join(prefix + k for k in unknown)}; "
                      f"known keys: {', '.join(sorted(fields))}")
  kwargs = {}
  for key, value in values.items():
    if key in SECTIONS and cls is TrainConfig:
      continue
    kwargs[key] = _check_type(prefix + key, value, hints[key])
  return kwargs


def from_config_dict(config: ml_collections.ConfigDict) -> TrainConfig:
  """Validated dataclasses from a ConfigDict; raises ConfigError naming the offending key."""
  values = config.to_dict()
  sections = {}
  for name, cls in SECTIONS.items():
    if name not in values:
      raise ConfigError(f"config has no section config.{name}")
    section_values = values[name]
    if not isinstance(section_values, dict):
      raise ConfigError(f"config.{name} must be a section (ConfigDict), got "
                        f"{type(section_values).__name__}")
    kwargs = checked_kwargs(cls, section_values, f"config.{name}.")
    try:
      sections[name] = cls(**kwargs)
    except (ValueError, TypeError) as e:
      raise ConfigError(str(e)) from e
  run_kwargs = checked_kwargs(TrainConfig, values, "config.")
  try:
    return TrainConfig(**sections, **run_kwargs)
  except ConfigError:
    raise
  except (ValueError, TypeError) as e:
    raise ConfigError(str(e)) from e
