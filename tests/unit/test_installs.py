"""Reproducible installs: every dependency pyproject.toml names, extras included, is pinned in
constraints.txt at a version its specifier admits, and the Makefile installs with it."""

import re
import subprocess

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.helpers import ROOT

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)$")


def pins(text: str) -> dict[str, Version]:
  """constraints.txt's `name==version` lines by canonical name; anything else but comments is
  an error naming the line."""
  found = {}
  for number, line in enumerate(text.splitlines(), 1):
    line = line.strip()
    if not line or line.startswith("#"):
      continue
    match = PIN.match(line)
    assert match, f"constraints.txt:{number}: not an exact pin: {line!r}"
    found[canonicalize_name(match[1])] = Version(match[2])
  return found


def requirements(pyproject: dict) -> list[Requirement]:
  project = pyproject["project"]
  named = list(project["dependencies"])
  for extra in project["optional-dependencies"].values():
    named += extra
  return [Requirement(r) for r in named]


def unpinned(pyproject: dict, pinned: dict[str, Version]) -> list[str]:
  """Each requirement with no pin, or a pin its specifier refuses."""
  wrong = []
  for requirement in requirements(pyproject):
    version = pinned.get(canonicalize_name(requirement.name))
    if version is None:
      wrong.append(f"{requirement}: not in constraints.txt")
    elif not requirement.specifier.contains(version, prereleases=True):
      wrong.append(f"{requirement}: constraints.txt pins {version}")
  return wrong


def test_every_dependency_is_pinned_at_a_version_pyproject_admits():
  pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
  pinned = pins((ROOT / "constraints.txt").read_text())
  assert unpinned(pyproject, pinned) == []
  # (a local build label would tie the lock to one index: torch's +cpu)
  assert all(v.local is None for v in pinned.values())


def test_a_missing_or_refused_pin_is_named():
  pyproject = {"project": {"dependencies": ["jax>=0.10,<0.11.1", "flax"],
                           "optional-dependencies": {"tpu": ["jax[tpu]>=0.10"]}}}
  assert unpinned(pyproject, pins("# header\njax==0.10.2\nflax==0.12.1\n")) == []
  assert unpinned(pyproject, pins("jax==0.11.2\nflax==0.12.1\n")) == [
    "jax<0.11.1,>=0.10: constraints.txt pins 0.11.2"]
  assert unpinned(pyproject, pins("jax==0.10.2\n")) == ["flax: not in constraints.txt"]


def test_make_installs_with_the_constraints(tmp_path):
  """make's own expansion (a dry run into an empty folder): both installs of the package take
  `-c constraints.txt`, and none without."""
  dry_run = subprocess.run(["make", "-n", "-B", "install-test", f"VENV={tmp_path / 'venv'}"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout
  installs = re.findall(r"pip install (-e '\.\[[^']*\]'[^>\n]*?)\s*>>", dry_run)
  assert len(installs) == 2 and all(i.endswith(" -c constraints.txt") for i in installs), installs
