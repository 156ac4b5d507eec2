"""Decoding is a library over the model's decoding interface: the model knows nothing of
searches, nothing outside the model reads its cache by variable names, and what a decoding
module keeps private stays in it (tools, benchmarks, tests and docs use the public names)."""

import ast
import re

from tests.helpers import ROOT

PACKAGE = ROOT / "transformer_jax"
SEARCH_WORDS = re.compile(r"beam|hypothes|ancestr", re.IGNORECASE)
CACHE_NAMES = re.compile(r"""["'](cached_key|cached_value)["']""")


def test_no_line_of_the_model_speaks_of_beams_hypotheses_or_ancestry():
  found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
           for p in sorted((PACKAGE / "model").glob("*.py"))
           for n, line in enumerate(p.read_text().splitlines(), 1) if SEARCH_WORDS.search(line)]
  assert not found, "\n".join(found)


def test_only_the_model_reads_its_cache_by_variable_names():
  found = [str(p.relative_to(ROOT)) for p in sorted(PACKAGE.rglob("*.py"))
           if "model" not in p.relative_to(PACKAGE).parts and CACHE_NAMES.search(p.read_text())]
  assert not found
  decoding = "".join(p.read_text() for p in (PACKAGE / "decoding").glob("*.py"))
  assert not re.search(r"""["'](self|cross)_attention["']""", decoding)


def _private_names(path) -> set[str]:
  tree = ast.parse(path.read_text())
  names = {node.name for node in tree.body
           if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
  names |= {t.id for node in tree.body if isinstance(node, ast.Assign)
            for t in node.targets if isinstance(t, ast.Name)}
  return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_no_private_decoding_name_is_used_outside_its_module():
  texts = {p: p.read_text() for p in (*ROOT.glob("transformer_jax/**/*.py"),
                                       *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*.py"),
                                       *ROOT.glob("docs/**/*.md"))}
  found = []
  for module in sorted((PACKAGE / "decoding").glob("*.py")):
    for name in _private_names(module):
      used = re.compile(rf"\b{module.stem}\.{name}\b|import [^\n]*\b{name}\b|`{name}`")
      found += [f"{p.relative_to(ROOT)}: {module.stem}.{name}" for p, text in texts.items()
                if p != module and name in text and used.search(text)]
  assert not found, "\n".join(sorted(found))


def test_the_searches_import_no_model():
  """Beam, greedy and sampling search, their rules, their batches and MBR take the model's
  decoding interface; only `decoding/ensemble.py` (the interface over several models) and the
  engine that makes one ready import the model's side."""
  for name in ("search", "batches", "rules", "slots", "scheduler", "beam_caches", "mbr"):
    tree = ast.parse((PACKAGE / "decoding" / f"{name}.py").read_text())
    imported = [node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for a in node.names]
    assert not [m for m in imported if m and (m.startswith("transformer_jax.model")
                                              or m == "transformer_jax.decoding.ensemble")], name
