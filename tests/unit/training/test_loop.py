"""The training loop on the tiny config: what a run writes, and a finished run rerun trains no
further step. (Exact resume after a kill: tests/integration/test_reliability.py.)"""

import json
import logging

from tests import helpers


def test_a_run_writes_its_outputs(tiny_run):
  records = helpers.read_metrics(tiny_run)
  keys = set().union(*records)
  for key in ("train/loss", "train/nll", "train/grad_norm", "train/learning_rate",
              "eval/loss", "eval/bleu", "eval/chrf", "perf/tokens_per_sec",
              "data/filtered_examples"):
    assert key in keys, key
  assert all("step" in r for r in records)
  assert [r["step"] for r in records if "eval/bleu" in r] == [10, 20]
  assert (tiny_run / "spm.model").is_file() and (tiny_run / "tokenizer.json").is_file()
  assert json.loads((tiny_run / "config.json").read_text())["model"]["d_model"] == 32
  assert helpers.checkpoint_steps(tiny_run) == [10, 20]
  assert len(helpers.checkpoint_steps(tiny_run, "checkpoints_best")) == 1
  assert (tiny_run / "metrics.png").stat().st_size > 10_000
  assert list((tiny_run / "tensorboard").iterdir())
  losses = [r["train/loss"] for r in records if "train/loss" in r]
  assert len(losses) == 4 and losses[-1] < losses[0]


def test_a_finished_run_rerun_trains_no_further_step(tiny_run, tfds_cache, tmp_path, caplog):
  run = helpers.copy_run(tiny_run, tmp_path / "run")
  with caplog.at_level(logging.INFO, logger="transformer_jax"):
    final = helpers.train_in_process(run, tfds_cache, run / "spm.model")
  assert "Resuming from step 20" in caplog.text
  assert final == {}  # nothing trained, nothing evaluated
  assert helpers.read_metrics(run) == helpers.read_metrics(tiny_run)
  assert helpers.checkpoint_steps(run) == [10, 20]
