"""Config files and command-line overrides, with a one-line error for every mistake in them.

A config file is a Python file whose `get_config()` returns an `ml_collections.ConfigDict`
(`configs/*.py`, sweep specs in `configs/sweeps/*.py`). Overrides `--config.model.d_model=512`
replace one value each, parsed by the type of the value they replace; `--config.KEY` alone sets
a boolean. A missing file, a syntax or runtime error in one, a file without `get_config`, an
unknown key (with the closest known one suggested) and an unparsable value each raise a
ConfigError naming the file and line, or the flag.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import sys
import traceback
from pathlib import Path

import ml_collections

from transformer_jax.config.parse import did_you_mean, parse_value
from transformer_jax.errors import ConfigError

log = logging.getLogger(__name__)
_loaded = itertools.count()
# The configs shipped inside the package (transformer_jax/configs; `configs/` in a checkout
# links there), so that `--config=configs/tiny.py` works as well from an installed wheel.
SHIPPED = Path(__file__).resolve().parents[1] / "configs"


def _where(path: Path, error: BaseException) -> str:
  """'FILE:LINE' of the innermost frame of `error` in a config file (not in a library)."""
  frames = [f for f in traceback.extract_tb(error.__traceback__)
            if "site-packages" not in f.filename and not f.filename.startswith("<")]
  if not frames:
    return str(path)
  return f"{frames[-1].filename}:{frames[-1].lineno}"


def shipped(path: str) -> Path | None:
  """The shipped config that a relative `path` not found here names (`configs/tiny.py`, or
  `tiny.py`, `sweeps/default_tpe.py` under the shipped folder), or None."""
  relative = Path(path)
  if relative.is_absolute() or relative.suffix != ".py":
    return None
  if relative.parts[0] == "configs":
    relative = Path(*relative.parts[1:])
  candidate = SHIPPED / relative
  return candidate if relative.parts and candidate.is_file() else None


def shipped_names() -> list[str]:
  """The shipped configs as `configs/...` paths."""
  return sorted(f"configs/{p.relative_to(SHIPPED)}" for p in SHIPPED.rglob("*.py")
                if p.name != "__init__.py")


def load_file(path: str) -> ml_collections.ConfigDict:
  """The ConfigDict that `get_config()` of the Python file at `path` returns (a relative path
  that is not here but names a shipped config: that one)."""
  file = Path(path)
  if not file.exists() and (shipped_file := shipped(path)):
    file = shipped_file
    log.info("%s is not here: the shipped %s", path, file)
  if not file.is_file():
    raise ConfigError(f"{path}: no such config file" + (
        " (it is a folder)" if file.is_dir() else
        f"; the shipped ones: {', '.join(shipped_names())}"))
  name = f"_transformer_jax_config_{next(_loaded)}"
  spec = importlib.util.spec_from_file_location(name, file)
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module  # (dataclasses and pickling look modules up by name)
  try:
    spec.loader.exec_module(module)
  except SyntaxError as e:
    raise ConfigError(f"{e.filename}:{e.lineno}: {e.msg}") from None
  except Exception as e:  # noqa: BLE001 (whatever the file raises is the user's to fix)
    raise ConfigError(f"{_where(file, e)}: {type(e).__name__}: {e}") from None
  get_config = getattr(module, "get_config", None)
  if not callable(get_config):
    raise ConfigError(f"{path} defines no get_config() function")
  try:
    config = get_config()
  except Exception as e:  # noqa: BLE001
    raise ConfigError(f"{_where(file, e)}: {type(e).__name__} in get_config(): {e}") from None
  if not isinstance(config, ml_collections.ConfigDict):
    raise ConfigError(f"{path}: get_config() returned {type(config).__name__}, expected an "
                      "ml_collections.ConfigDict")
  return config


def split_overrides(argv: list[str], names) -> tuple[list[str], dict[str, list[str]]]:
  """Takes the `--NAME.KEY[=VALUE]` arguments for each config flag NAME out of `argv`;
  returns the other arguments and, per NAME, its override arguments as given."""
  rest, overrides = [], {name: [] for name in names}
  for arg in argv:
    name = next((n for n in names if arg.startswith(f"--{n}.")), None)
    if name is None:
      rest.append(arg)
    else:
      overrides[name].append(arg)
  return rest, overrides


def find_field(config: ml_collections.ConfigDict, path: str, where: str, name: str = "config"):
  """(the section holding the dotted `path`, its last key); a ConfigError naming `where` when
  a key on the way is unknown (the closest known key is suggested) or is not a section."""
  parts = path.split(".")
  parent = config
  for depth, part in enumerate(parts):
    section = ".".join([name] + parts[:depth])
    if not isinstance(parent, ml_collections.ConfigDict):
      raise ConfigError(f"{where}: {section} is a value, not a section")
    if part not in parent:
      raise ConfigError(f"{where}: {section} has no key {part!r}"
                        f"{did_you_mean(part, parent.keys())}")
    if depth < len(parts) - 1:
      parent = parent[part]
  return parent, parts[-1]


def apply_overrides(config: ml_collections.ConfigDict, overrides: list[str], name: str
                    ) -> ml_collections.ConfigDict:
  """A copy of `config` with `--NAME.KEY=VALUE` arguments applied, in order."""
  config = ml_collections.ConfigDict(config.to_dict())
  for arg in overrides:
    key, sep, text = arg[len(f"--{name}."):].partition("=")
    parent, field = find_field(config, key, f"--{name}.{key}", name)
    current = parent[field]
    if isinstance(current, ml_collections.ConfigDict):
      raise ConfigError(f"--{name}.{key} is a section; override its keys, e.g. "
                        f"--{name}.{key}.{next(iter(current.keys()), 'KEY')}=VALUE")
    if not sep:
      if not isinstance(current, bool):
        raise ConfigError(f"--{name}.{key} needs a value: --{name}.{key}=VALUE")
      text = "true"
    parent[field] = parse_value(text, type(current), f"--{name}.{key}")
  return config
