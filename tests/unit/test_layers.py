"""The package's shape: its layers import only downwards, no module imports a project module
inside a function, no import cycle, modules stay small and the entry points thin, and every
command-line tool has a console script; training/ is a driver over functions of at most 60
lines."""

import ast

import pytest
import tomllib

from tests.helpers import ROOT

PACKAGE = ROOT / "transformer_jax"
# Bottom to top: a module may import from its own package and from the layers below it.
# The shipped config files sit just above config/: they import only each other and config/
# (the sweep specs' search-space vocabulary), never the code that runs them.
LAYERS = ["errors", "atomic", "config", "configs", "ops", "model", "data", "parallel", "reporting",
          "workdir", "decoding", "evaluation", "training", "aot", "inference", "interop",
          "serving", "sweeps", "cli"]


def _modules():
  for path in sorted(PACKAGE.rglob("*.py")):
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    yield name, path


def _project_imports(tree):
  """(imported module, whether it sits inside a function or class body) for each import of a
  transformer_jax module."""
  found = []

  def visit(node, nested):
    for child in ast.iter_child_nodes(node):
      inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
      if isinstance(child, ast.Import):
        found.extend((a.name, inner) for a in child.names if a.name.startswith("transformer_jax"))
      elif isinstance(child, ast.ImportFrom) and (child.module or "").startswith(
          "transformer_jax"):
        for alias in child.names:  # `from transformer_jax.x import y`: y may be a module
          candidate = f"{child.module}.{alias.name}"
          is_module = (ROOT / (candidate.replace(".", "/") + ".py")).is_file() or \
              (ROOT / candidate.replace(".", "/")).is_dir()
          found.append((candidate if is_module else child.module, inner))
      visit(child, inner)
  visit(tree, False)
  return found


def _layer(module: str) -> int:
  return LAYERS.index(module.split(".")[1])


GRAPH = {name: _project_imports(ast.parse(path.read_text())) for name, path in _modules()
         if name != "transformer_jax"}


def test_a_config_that_imports_the_code_above_it_is_caught():
  upward = _project_imports(ast.parse("from transformer_jax.sweeps import study\n"))
  assert [_layer(target) > _layer("transformer_jax.configs.default") for target, _ in upward] \
      == [True]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down_and_none_hides_in_a_function(module):
  for target, nested in GRAPH[module]:
    assert not nested, f"{module} imports {target} inside a function"
    same_package = target.split(".")[1] == module.split(".")[1]
    assert same_package or _layer(target) < _layer(module), \
        f"{module} (layer {module.split('.')[1]}) imports {target}, a layer above or beside it"


def test_no_import_cycle():
  state = {}

  def visit(module, path):
    if state.get(module) == "done":
      return
    assert state.get(module) != "visiting", "import cycle: " + " -> ".join(path + [module])
    state[module] = "visiting"
    for target, _ in GRAPH.get(module, ()):
      visit(target, path + [module])
    state[module] = "done"
  for module in GRAPH:
    visit(module, [])


def test_modules_are_small_and_entry_points_thin():
  for name, path in _modules():
    lines = len(path.read_text().splitlines())
    limit = 60 if name.startswith("transformer_jax.cli.") and name != "transformer_jax.cli" \
        and not name.endswith("runner") else 400
    assert lines <= limit, f"{path.relative_to(ROOT)} has {lines} lines (at most {limit})"
  assert len((ROOT / "train.py").read_text().splitlines()) <= 60


def test_the_training_loop_is_a_small_driver_over_short_functions():
  """No function in training/ over 60 lines: the loop's decisions live in decisions.py, where
  they are tested without training."""
  for path in sorted((PACKAGE / "training").glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        lines = node.end_lineno - node.lineno + 1
        assert lines <= 60, f"{path.name}::{node.name} has {lines} lines (at most 60)"


def test_every_tool_has_a_console_script():
  scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
  tools = {p.stem for p in (PACKAGE / "cli").glob("*.py")} - {"__init__", "runner", "help_pages"}
  # (import_model.py: `import` is a Python keyword, not a module name)
  expected = {f"transformer-jax-{t.removesuffix('_model').replace('_', '-')}":
              f"transformer_jax.cli.{t}:main" for t in tools}
  assert scripts == expected
