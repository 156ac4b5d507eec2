"""The reference page of the config keys (docs/reference/config-keys.md): every key of every
section, its value in configs/default.py and what it means, read from the comments beside the
fields of the section dataclasses, where they are written once. `python -m
transformer_jax.config.reference` prints the page; a test keeps the file equal to it."""

from __future__ import annotations

import dataclasses
import inspect
import re
import typing

from transformer_jax.config.corpora import CleaningConfig, CorpusConfig, SubwordSamplingConfig
from transformer_jax.config.fields import ByEngine, options
from transformer_jax.config.files import load_file
from transformer_jax.config.model import ModelConfig
from transformer_jax.config.population import PopulationConfig
from transformer_jax.config.sections import (
  DataConfig,
  DecodeConfig,
  InitFromConfig,
  OptimizerConfig,
  ParallelismConfig,
  PlanConfig,
  TrainConfig,
)

# (the key prefix, its dataclass), in the order of the page
SECTIONS = [("config", TrainConfig), ("config.model", ModelConfig),
            ("config.data", DataConfig), ("config.data.cleaning", CleaningConfig),
            ("config.data.subword_sampling", SubwordSamplingConfig),
            ("config.data.corpora.NAME", CorpusConfig), ("config.optimizer", OptimizerConfig),
            ("config.decode", DecodeConfig), ("config.parallelism", ParallelismConfig),
            ("config.init_from", InitFromConfig), ("config.population", PopulationConfig),
            ("config.plan", PlanConfig)]
_FIELD = re.compile(r"^  (\w+): [^#]*?(?:#\s?(.*))?$")
_COMMENT = re.compile(r"#\s?(.*)$")


def field_comments(cls) -> dict[str, str]:
  """Each field's comment: the one beside it and the comment lines indented under it, after
  those on their own lines just above it (at the field's indentation)."""
  comments, above, current = {}, [], None
  for line in inspect.getsource(cls).splitlines()[1:]:
    if line.startswith(("  def ", "  @")):
      break
    field = _FIELD.match(line)
    if field and field[1] != "__doc__":
      current = field[1]
      comments[current] = " ".join(above + ([field[2]] if field[2] else []))
      above = []
      continue
    comment = _COMMENT.search(line)
    if not comment or line.lstrip().startswith(('"""', "'''")):
      continue
    if line.startswith("  #"):  # (at the field's indentation: about the field below)
      above.append(comment[1])
    elif current:
      comments[current] = f"{comments[current]} {comment[1]}".strip()
  return comments


def _default(config, key: str, field: dataclasses.Field) -> str:
  """The value `config` gives `key`, else the field's own default (a corpus of a mixture)."""
  node = config
  for part in key.split(".")[1:]:
    if part not in node:
      return "" if field.default is dataclasses.MISSING else f"`{field.default!r}`"
    node = node[part]
  return f"`{node!r}`"


def page() -> str:
  default = load_file("configs/default.py")
  lines = ["# Config keys", "",
           "Every key of a run's config, its value in `configs/default.py` (the one place values",
           "live; the other shipped configs start from it) and what it means. Set any of them",
           "with `--config.KEY=VALUE`. This page is printed by `python -m",
           "transformer_jax.config.reference` from the comments beside the fields of",
           "`transformer_jax/config/` (`model.py`, `sections.py`, `decoding.py`, `corpora.py`,",
           "`population.py`);",
           "`tests/unit/config/test_reference.py` fails when it differs from them.", ""]
  for prefix, cls in SECTIONS:
    comments = field_comments(cls)
    about = ("The run-level keys." if cls is TrainConfig
             else inspect.getdoc(cls).split("\n\n")[0].replace("\n", " "))
    lines += [f"## `{prefix}`", "", about, "", "| key | default | meaning |", "|---|---|---|"]
    for field in dataclasses.fields(cls):
      key = f"{prefix}.{field.name}"
      if any(section.startswith(key) for section, _ in SECTIONS):
        continue  # (a section of its own)
      meaning = comments.get(field.name, "").replace("|", "\\|")
      lines.append(f"| `{key}` | {_default(default, key, field)} | {meaning} |")
    lines.append("")
    lines += _options_table(prefix, cls)
  return "\n".join(lines)


def _options_table(prefix: str, cls) -> list[str]:
  """The decoding options of `cls` as their declarations say them (`fields.Option`): the
  command line's item, a request's field, the values, whether a value compiles programs of
  its own, CTranslate2's equivalent."""
  declared = options(cls)
  if not declared:
    return []
  hints = typing.get_type_hints(cls)
  lines = [f"The same keys as decoding options (`{prefix}` of `fields.option`): "
           "`--decode=KEY=VALUE` of the tools; the field of a `/v1/translate` request's "
           "`options`; the values taken; \"shape\": a new value gives the search arrays of "
           "other shapes (or another program), \"static\": it compiles the search anew; how "
           "CTranslate2 (`--engine=ctranslate2`) honours it; whether our search does.", "",
           "| key | request | values | compiles | CTranslate2 | our search |",
           "|---|---|---|---|---|---|"]
  for name, option in declared.items():
    values = " ".join(filter(None, (hints[name].__name__, option.range_text())))
    lines.append(f"| `--decode={name}=` | {f'`{option.request}`' if option.request else ''} | "
                 f"{values} | {option.compiles} | {_ctranslate2(option.ctranslate2)} | "
                 f"{'yes' if option.search else 'no: refused'} |")
  return [*lines, ""]


def _ctranslate2(equivalent) -> str:
  if equivalent is None:
    return "none: refused"
  if isinstance(equivalent, str):
    return f"`{equivalent}`"
  if isinstance(equivalent, ByEngine):
    return f"the engine: {equivalent.how}"
  return " ".join(inspect.getdoc(equivalent).split())


if __name__ == "__main__":
  print(page(), end="")
