"""What a config field declares besides its type and comment, written once beside it: the
value that means what a run from before the key existed did (so that an older config.json
still loads), and the values it may take. Below the sections, which declare their fields
with `declared`."""

from __future__ import annotations

import dataclasses

from transformer_jax.config.checks import check_choice

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
