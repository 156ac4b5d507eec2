"""The config keys' reference page: equal to what the section dataclasses' comments say, and
every key with a meaning."""

import dataclasses
import re

from tests.helpers import ROOT
from transformer_jax.config import reference

PAGE = ROOT / "docs" / "reference" / "config-keys.md"


def test_the_page_is_what_the_sections_say():
  assert PAGE.read_text() == reference.page(), (
      "docs/reference/config-keys.md is out of date: python -m transformer_jax.config.reference"
      " > docs/reference/config-keys.md")


def test_every_key_of_every_section_has_a_row_with_a_meaning():
  rows = dict(re.findall(r"^\| `(config\.[^`]+)` \| [^|]* \| (.*) \|$", PAGE.read_text(),
                        re.MULTILINE))
  keys = {f"{prefix}.{f.name}" for prefix, cls in reference.SECTIONS
          for f in dataclasses.fields(cls)
          if not any(s.startswith(f"{prefix}.{f.name}") for s, _ in reference.SECTIONS)}
  assert set(rows) == keys and len(keys) > 100
  assert [key for key, meaning in rows.items() if not meaning.strip()] == []


@dataclasses.dataclass
class _Example:
  """An example."""
  plain: int
  commented: int                # beside it
  # above it, at the field's indentation,
  long: str                     # beside it,
                                # and under it
  last: float = 0.0             # with a default

  def method(self):  # (not a field)
    pass


def test_comments_are_read_beside_above_and_under_a_field():
  assert reference.field_comments(_Example) == {
    "plain": "", "commented": "beside it",
    "long": "above it, at the field's indentation, beside it, and under it",
    "last": "with a default"}
