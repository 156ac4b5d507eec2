"""The suite's shared fixtures, each built once by the first process that asks (the others
wait under a file lock): the tiny config's prepared corpus and tokenizer (per machine, kept
between runs: tests/caches.py) and the tiny run (per test run).

  python -m tests.builders NAME...   builds them in this order (conftest starts it in the
                                     background for BACKGROUND at the start of a run)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests import caches, helpers


def _data() -> Path:
  return Path(os.environ["TRANSFORMER_JAX_TEST_DATA"])


def _run_dir() -> Path:
  return Path(os.environ["TRANSFORMER_JAX_TEST_RUN_DIR"])


def _tiny_run(out: Path):
  helpers.train_in_process(out / "run", get("tfds_cache"), get("tiny_tokenizer") / "spm.model")


BUILDERS = {  # name: (its folder, how to build it)
    "tfds_cache": (lambda: _data() / "tfds", helpers.prepare_tiny_corpus),
    "tiny_tokenizer": (lambda: _data() / "tokenizer",
                       lambda out: helpers.train_tiny_tokenizer(out, get("tfds_cache"))),
    "tiny_run": (lambda: _run_dir() / "tiny_run", _tiny_run),
}
# The fixtures built in the background while the first tests run.
BACKGROUND = ("tfds_cache", "tiny_tokenizer", "tiny_run")


def get(name: str) -> Path:
  """The folder of fixture `name`, built now unless some process already has."""
  folder, build = BUILDERS[name]
  return caches.built_once(folder(), build)


if __name__ == "__main__":
  for fixture in sys.argv[1:]:
    print(fixture, get(fixture), flush=True)
