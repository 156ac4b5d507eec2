"""What a config field declares besides its type and comment, written once beside it: the
value that means what a run from before the key existed did (so that an older config.json
still loads), and the values it may take; a decoding option's declaration besides (`option`).
Below the sections, which declare their fields with `declared` and `option`."""

from __future__ import annotations

import dataclasses

from transformer_jax.config.checks import check_choice
from transformer_jax.errors import ConfigError

ALWAYS = dataclasses.MISSING  # (a key that every config.json has had)


def declared(*, before=ALWAYS, choices: tuple = (), **metadata):
  """A field whose key was added after workdirs were first written (`before`: the value that
  means what those runs did) or that takes one of `choices`; `metadata`: a section's own."""
  return dataclasses.field(metadata={"before": before, "choices": choices, **metadata})


def check_choices(prefix: str, section):
  """A ConfigError naming the first field of `section` whose value is not among its choices."""
  for f in dataclasses.fields(section):
    if f.metadata.get("choices"):
      check_choice(f"{prefix}.{f.name}", getattr(section, f.name), f.metadata["choices"])


def added_keys(sections: dict[str, type]) -> dict[tuple, object]:
  """{(section, key), or (key,) for a run-level key: its value for runs from before it} over
  `sections` (section name, "" for the run-level keys -> its dataclass)."""
  return {(*([name] if name else []), f.name): f.metadata["before"]
          for name, cls in sections.items() for f in dataclasses.fields(cls)
          if f.metadata.get("before", ALWAYS) is not ALWAYS}


@dataclasses.dataclass(frozen=True)
class ByEngine:
  """An option CTranslate2's engine honours around `translate_batch`, in its own code (see
  interop.engines): `how`, said on the reference page."""
  how: str


@dataclasses.dataclass(frozen=True)
class Option:
  """A decoding option's declaration (a field of config.decode, read with `options`): set on
  the command line as `--decode=KEY=VALUE`; by a request's `options.<request>` ("": not by
  requests); its values in a range (`minimum` <= v, `above` < v, v <= `maximum`; None: no
  bound); `compiles`: "shape" (a new value gives the search arrays of other shapes, or another
  program), "static" (a static argument of the compiled search: a new value compiles it anew)
  or "" (a traced value, or the host's); `ctranslate2`: how CTranslate2 honours it, a
  `translate_batch` keyword (the value passed as is), a function of the section giving
  keywords (its docstring says which), a ByEngine, or None (it cannot);
  `ctranslate2_note(section)`: what CTranslate2 does differently ("" where nothing);
  `search`: whether our search honours it. An engine that cannot honour an option refuses
  any value but the field's `before` (what runs did without it)."""
  request: str = ""
  minimum: float | None = None
  above: float | None = None
  maximum: float | None = None
  compiles: str = ""
  ctranslate2: object = None
  ctranslate2_note: object = None
  search: bool = True

  def range_text(self) -> str:
    """The values it takes, as `in [0, 1]`, `>= 1` or `> 0` ("" for any)."""
    low = (f"[{self.minimum:g}" if self.minimum is not None else
           f"({self.above:g}" if self.above is not None else "")
    if low and self.maximum is not None:
      return f"in {low}, {self.maximum:g}]"
    if self.maximum is not None:
      return f"<= {self.maximum:g}"
    return f"{'>=' if low[:1] == '[' else '>'} {low[1:]}" if low else ""

  def within(self, value) -> bool:
    return ((self.minimum is None or value >= self.minimum)
            and (self.above is None or value > self.above)
            and (self.maximum is None or value <= self.maximum))


def option(*, before=ALWAYS, choices: tuple = (), **declaration):
  """A decoding option's field (`Option`'s keywords; `before`, `choices` as `declared`'s)."""
  if (declaration.get("ctranslate2") is None or not declaration.get("search", True)) \
      and before is ALWAYS:
    raise TypeError("an option an engine cannot honour needs `before`: the value it refuses "
                    "nothing at")
  return declared(before=before, choices=choices, option=Option(**declaration))


def options(section_type) -> dict[str, Option]:
  """{field name: its Option} of a section's decoding options."""
  return {f.name: f.metadata["option"] for f in dataclasses.fields(section_type)
          if "option" in f.metadata}


def check_ranges(prefix: str, section):
  """A ConfigError naming the first option of `section` whose value is out of its range."""
  for name, declared_option in options(type(section)).items():
    value = getattr(section, name)
    if not declared_option.within(value):
      raise ConfigError(f"{prefix}.{name}={value!r} must be {declared_option.range_text()}")


def unhonoured(section, engine_name: str) -> list[str]:
  """The options of `section` that the engine named `engine_name` ("jax": our search, or
  "ctranslate2") cannot honour at their values ([] when it honours them all)."""
  fields = {f.name: f for f in dataclasses.fields(section)}
  honours = {"jax": lambda o: o.search, "ctranslate2": lambda o: o.ctranslate2 is not None}
  return [name for name, declared_option in options(type(section)).items()
          if not honours[engine_name](declared_option)
          and getattr(section, name) != fields[name].metadata["before"]]


def check_honoured(section, engine_name: str, prefix: str):
  """A ConfigError naming the first option of `section` (`prefix`: how the tool names the
  section) that the engine named `engine_name` ("jax" or "ctranslate2") cannot honour at its
  value, and the engine (and the other one where it can)."""
  for name in unhonoured(section, engine_name):
    before = next(f.metadata["before"] for f in dataclasses.fields(section) if f.name == name)
    other = "ctranslate2" if engine_name == "jax" else "jax"
    raise ConfigError(f"{prefix}.{name}={getattr(section, name)!r}: the {engine_name} engine "
                      f"cannot honour it (leave it at {before!r}"
                      + ("" if name in unhonoured(section, other) else
                         f", or use --engine={other}") + ")")
