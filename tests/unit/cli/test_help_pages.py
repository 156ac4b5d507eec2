"""The tools' flags page: each console script's --help as the tool prints it."""

from tests.helpers import ROOT
from transformer_jax.cli import help_pages

PAGE = ROOT / "docs" / "reference" / "cli-flags.md"


def test_the_page_is_what_the_tools_print():
  page = help_pages.page()
  assert PAGE.read_text() == page, ("docs/reference/cli-flags.md is out of date: python -m "
                                    "transformer_jax.cli.help_pages > docs/reference/cli-flags.md")
  assert page.count("\n## `transformer-jax-") == len(help_pages.tools()) >= 14
  assert "--checkpoint: latest | best | all | STEP | average:N" in page  # (evaluate's own)
