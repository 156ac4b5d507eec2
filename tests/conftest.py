"""Shared test set-up.

- The repository root on sys.path (the tests import `configs.*` and `tests.helpers`).
- The suite's XLA flags and caches that outlive a run (tests/caches.py): one JAX compilation
  cache per machine, used by every process the tests start, and the tiny config's prepared
  data and tokenizer, built once per machine; XDG_CACHE_HOME points there too, so nothing the
  package caches (config.folders) lands in the user's home.
- Session fixtures, built once per test run (also across pytest-xdist workers, under a file
  lock) and then only read. The controller starts `python -m tests.builders` at once, which
  builds those the selected test files use in the background while the workers run the tests
  that need none of them (those that do come last in each worker's share).
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

from tests import caches  # noqa: E402  (imports no JAX)
from transformer_jax.parallel import platforms  # noqa: E402  (imports no JAX)

# Set before JAX is imported (it reads these once). The first pytest process of a run makes
# the run's folder; pytest-xdist's workers and every subprocess inherit it and the rest.
RUN_DIR = "TRANSFORMER_JAX_TEST_RUN_DIR"
_CONTROLLER = RUN_DIR not in os.environ
if _CONTROLLER:
  os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="transformer_jax_tests_")
  os.environ["XLA_FLAGS"] = caches.suite_xla_flags()
  _CACHE = caches.cache_root(os.environ["XLA_FLAGS"])
  # XDG_CACHE_HOME: the package's caches (prepared data, compiled programs, the numerics
  # probe's figures; matplotlib's too) go under the suite's folder, never the user's home.
  os.environ.update(XDG_CACHE_HOME=str(_CACHE / "xdg"),
                    JAX_COMPILATION_CACHE_DIR=str(_CACHE / "jax_cache"),
                    JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
                    TRANSFORMER_JAX_TEST_DATA=str(_CACHE / f"data_{caches.data_fingerprint()}"))
  platforms.leave_out_absent_tpu()  # (libtpu from the `tpu` extra: no TPU lookup per process)

from tests import builders  # noqa: E402

_builder: subprocess.Popen | None = None
# The fixtures that read a trained run built in the background: their modules run last in
# each worker's share.
LATE_FIXTURES = {"tiny_run", "reference", "exported"}


def pytest_configure(config):
  global _builder
  if not _CONTROLLER or config.option.collectonly:
    return
  paths = [Path(config.invocation_params.dir, arg.split("::")[0]) for arg in config.args]
  names = builders.wanted([p for p in paths if p.exists()])
  if names:
    log = open(Path(os.environ[RUN_DIR]) / "builders.log", "w")
    _builder = subprocess.Popen([sys.executable, "-m", "tests.builders", *names],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def pytest_unconfigure(config):
  if not _CONTROLLER:
    return
  if _builder is not None and _builder.poll() is None:
    _builder.kill()
    _builder.wait()
  shutil.rmtree(os.environ[RUN_DIR], ignore_errors=True)
  data = Path(os.environ["TRANSFORMER_JAX_TEST_DATA"])
  caches.prune(data.parent, data.name.removeprefix("data_"))


def pytest_collection_modifyitems(config, items):
  """Each worker's share (pytest-xdist hands out the collection in halves, then steals) starts
  with the modules that need no trained fixture; a module's tests stay together."""
  modules: dict = {}
  for item in items:
    modules.setdefault(item.module.__name__, []).append(item)
  needs = {name for name, group in modules.items()
           if any(LATE_FIXTURES & set(i.fixturenames) for i in group)}
  free = [g for name, g in modules.items() if name not in needs]
  late = [g for name, g in modules.items() if name in needs]
  ordered = free[:len(free) // 2] + late[:len(late) // 2] + free[len(free) // 2:] + \
      late[len(late) // 2:]
  items[:] = [item for group in ordered for item in group]


@pytest.fixture(scope="session")
def shared_dir() -> Path:
  """A folder of this test run shared by all its processes (for fixtures built once)."""
  return Path(os.environ[RUN_DIR])


@pytest.fixture(scope="session")
def tfds_cache() -> Path:
  """A TFDS cache folder holding the tiny config's corpus (embedded Multi30k, train + val)."""
  return builders.get("tfds_cache")


@pytest.fixture(scope="session")
def tiny_tokenizer(tfds_cache) -> Path:
  """The tiny config's SentencePiece model (500 pieces, trained on Multi30k's training split)."""
  return builders.get("tiny_tokenizer") / "spm.model"


@pytest.fixture(scope="session")
def tiny_run(tfds_cache, tiny_tokenizer) -> Path:
  """A workdir of the tiny config trained for 20 steps (checkpoints at 10 and 20, evaluated at
  both). Read only: tests that write into a run copy it first (`helpers.copy_run`)."""
  return builders.get("tiny_run") / "run"


@pytest.fixture(autouse=True)
def _program_store_off_after_each_test(monkeypatch):
  """A tool run in a test's process turns the program store on (runner): each test leaves it
  as it found it, off, so that no later test decodes through the suite's store unasked."""
  from transformer_jax.parallel import program_store  # (JAX's settings are made by now)
  monkeypatch.setitem(program_store._store, "folder", program_store._store["folder"])
