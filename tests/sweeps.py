"""What the sweep tests share (SQLite in test_sweep.py, PostgreSQL in test_postgres.py): a
grid spec over learning rates on the tiny config, the sweep command, and waiting on a run."""

import sys
import time
from pathlib import Path

from tests import helpers

SPEC = """
from transformer_jax.config.search_space import choice, new_spec
def get_config():
  s = new_spec()
  s.sampler = "grid"
  s.search_space = {{"optimizer": {{"learning_rate": choice({lrs})}}}}
  s.fixed = {{"num_train_steps": 6, "eval_every_steps": 2, "checkpoint_every_steps": 2,
             "log_every_steps": 2, "eval_max_sentences": 8,
             "optimizer": {{"warmup_steps": 1}}}}
  s.objective = "eval/loss"
  s.pruner = "median"
  s.pruner_startup_trials = 2
  return s
"""


def command(tmp_path: Path, cache_dir: Path, lrs, *extra: str, template: str = SPEC,
            workdir: Path | None = None) -> list[str]:
  """The sweep worker's command line (spec written to tmp_path/spec.py; workdir default
  tmp_path/sweep; heartbeats every second, stale after 3)."""
  spec = tmp_path / "spec.py"
  spec.write_text(template.format(lrs=", ".join(map(repr, lrs))))
  return [sys.executable, "-m", "transformer_jax.cli.sweep", "--config=configs/tiny.py",
          f"--sweep={spec}", f"--workdir={workdir or tmp_path / 'sweep'}",
          f"--config.data.cache_dir={cache_dir}", "--heartbeat_interval=1",
          "--heartbeat_grace=3", *helpers.ONE_LAYER_FLAGS, *extra]


def wait_for(condition, timeout_s: float = 300, what: str = ""):
  deadline = time.time() + timeout_s
  while not condition():
    assert time.time() < deadline, f"timed out waiting for {what}"
    time.sleep(0.2)
