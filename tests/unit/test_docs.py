"""The docs point at what exists: every relative link of a Markdown file (its heading too, for
`file.md#heading`) and every `--config.` key they name, a key of some shipped config."""

import re
import subprocess

from tests.helpers import ROOT
from transformer_jax.config.files import SHIPPED, find_field, load_file
from transformer_jax.errors import ConfigError

# (over the whole file: a link's text may span lines; its target may not)
LINK = re.compile(r"\[[^\]]*\]\(([^)]+)\)")
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CONFIG_KEY = re.compile(r"--config\.([A-Za-z0-9_.]*[A-Za-z0-9_])")


def docs() -> list:
  tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
  return [ROOT / p for p in tracked if not p.startswith("transformer_jax/corpora/")]


def anchor(heading: str) -> str:
  """GitHub's id for a heading: lower case, punctuation and symbols dropped, spaces hyphens."""
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
  """The ids of a page's headings (a `#` line inside a fenced block is no heading)."""
  return {anchor(h) for h in re.findall(r"^#+ (.+)$", FENCED.sub("", markdown), re.MULTILINE)}


def broken_links(path, root=ROOT) -> list[str]:
  """`path:line: target` (path relative to `root`) for each relative link whose file, or
  heading, is not there."""
  broken = []
  text = FENCED.sub(lambda m: "\n" * m[0].count("\n"), path.read_text())  # (lines kept)
  for match in LINK.finditer(text):
    target, number = match[1], text.count("\n", 0, match.start(1)) + 1
    if re.match(r"[a-z]+:", target):  # (http:, https:, mailto:)
      continue
    file, _, heading = target.partition("#")
    linked = (path.parent / file).resolve() if file else path
    if re.search(r"\s", target) or not linked.exists() or (
        heading and linked.suffix == ".md" and heading not in anchors(linked.read_text())):
      broken.append(f"{path.relative_to(root)}:{number}: {target!r}")
  return broken


def shipped_configs() -> list:
  return [load_file(str(p)) for p in sorted(SHIPPED.glob("*.py")) if p.name != "__init__.py"]


def unknown_keys(text: str, configs) -> list[str]:
  """Each `--config.` key of `text` that no config of `configs` has (placeholders in capitals,
  `--config.SECTION.KEY`, are not keys; nor is the key an error message quotes)."""
  unknown, keys = [], set()
  for match in CONFIG_KEY.finditer(text):
    if not text[:match.start()].endswith("config error: "):  # (quoting a wrong key's error)
      keys.add(match[1])
  for key in sorted(keys):
    if any(part.isupper() for part in key.split(".")):
      continue
    if not any(_has(config, key) for config in configs):
      unknown.append(key)
  return unknown


def _has(config, key: str) -> bool:
  try:
    parent, field = find_field(config, key, "docs")
  except ConfigError:
    return False
  return field in parent


def test_every_relative_link_of_the_docs_exists():
  assert [b for path in docs() for b in broken_links(path)] == []


def test_every_config_key_the_docs_name_is_a_key_of_a_shipped_config():
  configs = shipped_configs()
  # (keyed by the path from the root: README.md and docs/README.md share a name)
  unknown = {str(path.relative_to(ROOT)): unknown_keys(path.read_text(), configs)
             for path in docs()}
  assert {name: keys for name, keys in unknown.items() if keys} == {}


def test_a_broken_link_or_an_unknown_key_is_named(tmp_path):
  (tmp_path / "other.md").write_text("## Its section (2 × faster, ≤ 15 s)\n")
  doc = tmp_path / "page.md"
  doc.write_text("# A page\n[ok](#a-page) [gone](#no-such-heading) [file](missing.md)\n"
                 "[there](other.md#its-section-2--faster--15-s) [not](other.md#its-section)\n"
                 "[text over\ntwo lines](other.md) [split](../\nother.md)\n"
                 "```\n# not a heading\n```\n[code](#not-a-heading)\n")
  assert broken_links(doc, tmp_path) == [
    "page.md:2: '#no-such-heading'", "page.md:2: 'missing.md'",
    "page.md:3: 'other.md#its-section'", "page.md:5: '../\\nother.md'",
    "page.md:10: '#not-a-heading'"]
  assert unknown_keys("--config.model.num_heads=8 --config.model.num_head=8 "
                      "--config.data.corpora.bt.data_dir=x --config.SECTION.KEY "
                      "`config error: --config.model.num_headz: ...`",
                      shipped_configs()) == ["model.num_head"]
