"""Measured figures live in BENCHMARKS.md and docs/results.md, beside their machine, date and
command; the package's docstrings and comments give the reason and cite the section, which
exists. (A figure quoted in code goes stale unseen. The shipped configs' own docstrings give
their expected runtime and result, as DESIGN.md asks.)"""

import ast
import functools
import io
import re
import tokenize

from tests.helpers import ROOT

PACKAGE = ROOT / "transformer_jax"
FIGURE = re.compile(
    # a ratio: 1.2x, 1.3-1.6x, 10x slower (not a name: TPU 7x)
    r"(?<![\w.])(\d+\.\d+(-\d+(\.\d+)?)?[x×](?!\w)|\d+(-\d+)?[x×](?=\s+[a-z]))"
    r"|\d+(\.\d+)?\s?%[^.;:()]{0,30}\b(faster|slower|step|overall)\b"  # a share of the time
    r"|\d+-core\b"                                               # the machine measured on
    r"|\d[\d,.]*\s?(sentences/s|sent/s|tokens/s|tok/s|GFLOP/s)"  # a speed
    r"|\d+(\.\d+)?\s?(µs|us|ms)\b")                                # a time measured
CITED = re.compile(r'BENCHMARKS\.md,? "([^"]+)"')


@functools.lru_cache(maxsize=None)
def _prose(path) -> list[tuple[int, str]]:
  """(line, text) of each comment and docstring of a module (a configs module's docstring
  aside)."""
  source = path.read_text()
  found = [(t.start[0], t.string.lstrip("#")) for t in
           tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
  tree = ast.parse(source)
  for node in ast.walk(tree):
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
      if node is tree and path.relative_to(PACKAGE).parts[0] == "configs":
        continue
      if ast.get_docstring(node) is not None:
        found.append((node.body[0].lineno, ast.get_docstring(node)))
  return found


def _files_with(pattern: re.Pattern) -> list:
  """The package's modules whose text matches `pattern` somewhere (code included): the only
  ones whose prose can."""
  return [p for p in sorted(PACKAGE.rglob("*.py")) if pattern.search(p.read_text())]


def _words(text: str) -> str:
  return " ".join(text.split())


def test_no_measured_figure_in_the_packages_docstrings_and_comments():
  found = [f"{path.relative_to(ROOT)}:{line}: {match[0]!r}"
           for path in _files_with(FIGURE) for line, text in _prose(path)
           for match in FIGURE.finditer(text)]
  assert not found, "figures belong in BENCHMARKS.md (cite its section):\n" + "\n".join(found)


def test_the_benchmark_sections_the_package_cites_exist():
  headings = [_words(line.lstrip("#")) for line in
              (ROOT / "BENCHMARKS.md").read_text().splitlines() if line.startswith("#")]
  cited = {(path.relative_to(ROOT), title) for path in _files_with(re.compile("BENCHMARKS"))
           for title in CITED.findall(_words(" ".join(t for _, t in _prose(path))))}
  assert len(cited) > 5  # (the pattern finds them)
  missing = [f"{path}: {title!r}" for path, title in sorted(cited)
             if not any(h.startswith(_words(title)) for h in headings)]
  assert not missing, "no such section in BENCHMARKS.md:\n" + "\n".join(missing)
