"""Shared test set-up.

- The repository root on sys.path (the tests import `configs.*` and `tests.helpers`).
- One persistent JAX compilation cache per test run, used by every process the tests start:
  the dozens of training subprocesses compile the same tiny-model programs once.
- Session fixtures, built once per test run (also across pytest-xdist workers, under a file
  lock) and then only read: the embedded Multi30k prepared as a TFDS dataset, the tiny
  config's tokenizer, and a tiny run trained for 20 steps.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
  sys.path.insert(0, str(ROOT))

# Set before JAX is imported (it reads these once). The first pytest process of a run makes
# the folder; pytest-xdist's workers and every subprocess inherit it.
RUN_DIR = "TRANSFORMER_JAX_TEST_RUN_DIR"
_MADE_RUN_DIR = RUN_DIR not in os.environ
if _MADE_RUN_DIR:
  os.environ[RUN_DIR] = tempfile.mkdtemp(prefix="transformer_jax_tests_")
os.environ.update(JAX_COMPILATION_CACHE_DIR=os.path.join(os.environ[RUN_DIR], "jax_cache"),
                  JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                  JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")

from tests import helpers  # noqa: E402


def pytest_unconfigure(config):
  if _MADE_RUN_DIR:
    shutil.rmtree(os.environ[RUN_DIR], ignore_errors=True)


def _shared() -> Path:
  return Path(os.environ[RUN_DIR])


@pytest.fixture(scope="session")
def shared_dir() -> Path:
  """A folder of this test run shared by all its processes (for fixtures built once)."""
  return _shared()


@pytest.fixture(scope="session")
def tfds_cache() -> Path:
  """A TFDS cache folder holding the tiny config's corpus (embedded Multi30k, train + val)."""
  return helpers.built_once(_shared() / "tfds", helpers.prepare_tiny_corpus)


@pytest.fixture(scope="session")
def tiny_tokenizer(tfds_cache) -> Path:
  """The tiny config's SentencePiece model (500 pieces, trained on Multi30k's training split)."""
  folder = helpers.built_once(_shared() / "tokenizer",
                              lambda out: helpers.train_tiny_tokenizer(out, tfds_cache))
  return folder / "spm.model"


@pytest.fixture(scope="session")
def tiny_run(tfds_cache, tiny_tokenizer) -> Path:
  """A workdir of the tiny config trained for 20 steps (checkpoints at 10 and 20, evaluated at
  both). Read only: tests that write into a run copy it first (`helpers.copy_run`)."""
  folder = helpers.built_once(
      _shared() / "tiny_run", lambda out: helpers.train_in_process(out / "run", tfds_cache,
                                                                   tiny_tokenizer))
  return folder / "run"
