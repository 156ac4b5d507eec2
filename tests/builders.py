"""The suite's shared fixtures, each built once by the first process that asks (the others
wait under a file lock): the tiny config's prepared corpus and tokenizer (per machine, kept
between runs: tests/caches.py), and per test run the tiny run, the reliability tests'
uninterrupted reference run and the export tests' trained and exported model.

  python -m tests.builders NAME...   builds them in this order (conftest starts it in the
                                     background for BACKGROUND at the start of a run)
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

from tests import caches, helpers
from transformer_jax.interop.ctranslate2_export import export


def _data() -> Path:
  return Path(os.environ["TRANSFORMER_JAX_TEST_DATA"])


def _run_dir() -> Path:
  return Path(os.environ["TRANSFORMER_JAX_TEST_RUN_DIR"])


def _tiny_run(out: Path):
  helpers.train_in_process(out / "run", get("tfds_cache"), get("tiny_tokenizer") / "spm.model")


# The reliability tests' schedule (train.py on the one-layer tiny config): 12 steps,
# checkpoints every 4.
RELIABILITY_STEPS = [*helpers.ONE_LAYER_FLAGS, "--config.num_train_steps=12",
                     "--config.checkpoint_every_steps=4", "--config.log_every_steps=2",
                     "--config.eval_every_steps=1000", "--config.eval_max_sentences=4",
                     "--config.max_checkpoints_to_keep=3"]


def _reliability_reference(out: Path):
  helpers.train_process(out / "reference", get("tfds_cache"), *RELIABILITY_STEPS,
                        tokenizer=get("tiny_tokenizer") / "spm.model")


# The export tests' model: the tiny config trained for 300 steps, validated only at the end on 8
# sentences, with a cap of 64 tokens (test2016's references have 13 words on average; a briefly
# trained model's repetitions would otherwise run to the default 128 on both sides).
EXPORT_RUN = {"num_train_steps": 300, "checkpoint_every_steps": 300, "data.batch_size": 32,
              "eval_every_steps": 1000, "eval_max_sentences": 8, "decode.max_length": 64,
              "data.test_split": ""}


def _export(out: Path):
  helpers.train_in_process(out / "run", get("tfds_cache"), get("tiny_tokenizer") / "spm.model",
                           **EXPORT_RUN)
  export(out / "run", "latest", out / "ct2")


BUILDERS = {  # name: (its folder, how to build it)
    "tfds_cache": (lambda: _data() / "tfds", helpers.prepare_tiny_corpus),
    "tiny_tokenizer": (lambda: _data() / "tokenizer",
                       lambda out: helpers.train_tiny_tokenizer(out, get("tfds_cache"))),
    "tiny_run": (lambda: _run_dir() / "tiny_run", _tiny_run),
    "reliability_reference": (lambda: _run_dir() / "reliability", _reliability_reference),
    "exported": (lambda: _run_dir() / "export", _export),
}
# The fixtures built in the background while the first tests run, in this order, each with the
# name of the pytest fixture through which tests read it.
BACKGROUND = {"tfds_cache": "tfds_cache", "tiny_tokenizer": "tiny_tokenizer",
              "tiny_run": "tiny_run", "reliability_reference": "reference",
              "exported": "exported"}


def wanted(paths: list[Path]) -> list[str]:
  """The BACKGROUND fixtures that a function of the test files under `paths` (files or
  folders; none: all of tests/) takes, in build order."""
  files = set()
  for path in paths or [Path(__file__).parent]:
    files |= set(path.rglob("test_*.py")) if path.is_dir() else {path}
  used = {arg.arg for f in files if f.is_file() for node in ast.walk(ast.parse(f.read_text()))
          if isinstance(node, ast.FunctionDef) for arg in node.args.args}
  return [name for name, fixture in BACKGROUND.items() if fixture in used]


def get(name: str) -> Path:
  """The folder of fixture `name`, built now unless some process already has."""
  folder, build = BUILDERS[name]
  return caches.built_once(folder(), build)


if __name__ == "__main__":
  for fixture in sys.argv[1:]:
    print(fixture, get(fixture), flush=True)
