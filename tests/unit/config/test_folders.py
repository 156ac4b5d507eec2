"""The package's cache folder (config/folders.py) follows XDG_CACHE_HOME, read when asked."""

import os
from pathlib import Path

from tests.caches import ROOT
from transformer_jax.config.folders import cache_home


def test_the_cache_folder_follows_xdg_cache_home_else_the_homes_dot_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  assert cache_home() == tmp_path / "transformer_jax"
  monkeypatch.delenv("XDG_CACHE_HOME")
  assert cache_home() == Path.home() / ".cache" / "transformer_jax"


def test_the_suite_keeps_the_packages_caches_out_of_the_users_home():
  """(conftest.py points XDG_CACHE_HOME at the suite's cache folder; subprocesses inherit it.)"""
  suite = Path(os.environ.get("TRANSFORMER_JAX_TEST_CACHE", ROOT / ".test-cache"))
  assert cache_home().is_relative_to(suite) and not cache_home().is_relative_to(
      Path.home() / ".cache")
