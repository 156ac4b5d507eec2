"""The reference page of the command-line tools' flags (docs/reference/cli-flags.md): each
console script's `--help`, as the tool prints it. `python -m transformer_jax.cli.help_pages`
prints the page; a test keeps the file equal to it."""

from __future__ import annotations

import contextlib
import importlib
import io
import os
from importlib import metadata
from unittest import mock


def tools() -> dict[str, str]:
  """Console script -> its module: the installed package's entry points."""
  scripts = metadata.entry_points(group="console_scripts")
  return {s.name: s.module for s in sorted(scripts, key=lambda s: s.name)
          if s.module.startswith("transformer_jax.cli.")}


def help_text(module: str) -> str:
  """What `TOOL --help` prints on an 80-column terminal (absl wraps at the terminal's width)."""
  out = io.StringIO()
  with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit), \
      mock.patch.dict(os.environ, {"COLUMNS": "80"}):
    importlib.import_module(module).main(["tool", "--help"])
  return out.getvalue()


def page() -> str:
  lines = ["# Command-line tools: every flag", "",
           "Each tool's `--help`, as it prints it (what the tools do, and the mistakes they",
           "name: [command-line tools](cli.md)). This page is printed by `python -m",
           "transformer_jax.cli.help_pages`; `tests/unit/cli/test_help_pages.py` fails when it",
           "differs from the tools.", ""]
  for name, module in tools().items():
    lines += [f"## `{name}`", "", "```text", help_text(module).rstrip(), "```", ""]
  return "\n".join(lines)


if __name__ == "__main__":
  print(page(), end="")
