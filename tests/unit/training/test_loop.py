"""The training loop on the tiny config: what a run writes, and a finished run rerun trains no
further step. (Exact resume after a kill: tests/integration/test_reliability.py.)"""

import json
import logging
import shutil

import pytest

from tests import helpers
from transformer_jax.config.parse import from_config_dict
from transformer_jax.inference import trained_run
from transformer_jax.parallel import numerics
from transformer_jax.training import stopping, validation
from transformer_jax.training.run import open_run


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


def _machine_choosing(monkeypatch, dtype: str):
  """Simulates a machine on which dtype "auto" resolves to `dtype`."""
  monkeypatch.setattr(numerics, "choose",
                      lambda *a, **k: numerics.Choice(dtype, f"simulated: {dtype} is faster"))


def test_a_spent_time_budget_ends_training_like_its_last_step_and_a_larger_one_resumes(
    tfds_cache, tiny_tokenizer, tmp_path, monkeypatch, caplog):
  run = tmp_path / "run"
  over = {**helpers.ONE_LAYER, "model.dtype": "auto", "data.test_split": "val",
          "time_budget_minutes": 1e-4}  # 6 ms: spent by the first step
  _machine_choosing(monkeypatch, "float32")  # a machine where bf16 is slow
  with caplog.at_level(logging.INFO, logger="transformer_jax"):
    final = helpers.train_in_process(run, tfds_cache, tiny_tokenizer, **over)
  assert "config.model.dtype=auto resolved to float32: simulated" in caplog.text
  assert json.loads((run / "config.json").read_text())["model"]["dtype"] == "float32"
  # ended as at a last step: saved, validated, tested, and the stop recorded
  assert final["time_budget_stop_at_step"] == 1
  assert helpers.checkpoint_steps(run) == [1]
  assert helpers.logged(run, "train/time_budget_stop", 1) == 1.0
  assert [r["step"] for r in helpers.read_metrics(run) if "eval/bleu" in r] == [1]
  test = json.loads((run / "eval" / "val" / "results.json").read_text())
  assert [r["steps"] for r in test] == [[1]] and final["test/bleu"] == test[0]["bleu"]
  first_minutes = helpers.logged(run, "time/train_minutes", 1)
  assert first_minutes >= 1e-4

  # the same budget again: nothing more to train
  caplog.clear()
  _machine_choosing(monkeypatch, "bfloat16")  # another machine: the run keeps its dtype
  with caplog.at_level(logging.INFO, logger="transformer_jax"):
    final = helpers.train_in_process(run, tfds_cache, tiny_tokenizer,
                                     **{**over, "data.test_split": ""})
  assert "was spent at step 1" in caplog.text and helpers.checkpoint_steps(run) == [1]
  assert ("config.model.dtype=auto resolved to float32: recorded in the workdir's config.json"
          in caplog.text)

  # a larger budget resumes from the budget stop and trains to the last step
  caplog.clear()
  with caplog.at_level(logging.INFO, logger="transformer_jax"):
    final = helpers.train_in_process(run, tfds_cache, tiny_tokenizer,
                                     **{**over, "time_budget_minutes": 60.0})
  assert "Resuming from step 1" in caplog.text and "time_budget_stop_at_step" not in final
  assert helpers.checkpoint_steps(run) == [1, 10, 20]
  assert json.loads((run / "config.json").read_text())["model"]["dtype"] == "float32"
  assert [r["steps"] for r in json.loads((run / "eval" / "val" / "results.json").read_text())
          ] == [[1], [20]]
  minutes = [r["time/train_minutes"] for r in helpers.read_metrics(run)
             if "time/train_minutes" in r]
  assert minutes == sorted(minutes) and minutes[0] == first_minutes  # summed over both runs
  # and evaluation uses the recorded dtype on this "bf16" machine
  assert trained_run.load(run).cfg.model.dtype == "float32"


def test_wall_clock_intervals_validate_and_save_at_logging_steps(tfds_cache, tiny_tokenizer,
                                                                 tmp_path):
  run = tmp_path / "run"
  helpers.train_in_process(run, tfds_cache, tiny_tokenizer, **{
      **helpers.ONE_LAYER, "num_train_steps": 15, "eval_every_steps": 1000,
      "checkpoint_every_steps": 1000, "eval_every_minutes": 1e-6,
      "checkpoint_every_minutes": 1e-6, "eval_max_sentences": 2})
  # (due whenever asked: at every logging step, 5 and 10, and at the last step, 15)
  assert helpers.checkpoint_steps(run) == [5, 10, 15]
  assert [r["step"] for r in helpers.read_metrics(run) if "eval/bleu" in r] == [5, 10, 15]


def test_wall_clock_intervals_count_from_the_last_event():
  now = [100.0]
  clock = stopping.WallClockIntervals(0.5, 0.0, clock=lambda: now[0])
  assert clock.active and clock.due() == (False, False)
  now[0] += 29
  assert clock.due() == (False, False)
  now[0] += 2
  assert clock.due() == (True, False)  # 31 s >= 30 s; checkpoints by time are off
  clock.done(0)
  assert clock.due() == (False, False)
  assert not stopping.WallClockIntervals(0.0, 0.0).active


def test_a_resumed_run_carries_its_data_counts_on(tiny_run, tfds_cache, tmp_path):
  """Resumed from the shared run's checkpoint of step 10: the pairs and epochs logged at step 20
  are those of the uninterrupted run (the counts of the batches before the checkpoint come from
  its record; which record is decisions.carried_counts's, tested in test_decisions.py)."""
  run = helpers.copy_run(tiny_run, tmp_path / "run")
  shutil.rmtree(run / "checkpoints" / "20")
  helpers.train_in_process(run, tfds_cache, tiny_run / "spm.model")
  assert helpers.checkpoint_steps(run) == [10, 20]
  for key in ("data/pairs_kept", "data/epochs", "data/filtered_too_long"):
    assert helpers.logged(run, key, 20) == helpers.logged(tiny_run, key, 20)
  assert helpers.logged(run, "data/pairs_kept", 20) > helpers.logged(run, "data/pairs_kept", 10)


def test_a_run_from_before_the_token_id_store_resumes_on_the_text_path(tfds_cache,
                                                                       tiny_tokenizer,
                                                                       tmp_path, caplog):
  """A workdir whose config.json predates config.data.pretokenize (its checkpoints hold the
  text pipeline's position) resumes with the text path, saying so, not with today's default."""
  run = tmp_path / "run"
  over = {**helpers.ONE_LAYER, "eval_max_sentences": 2}
  helpers.train_in_process(run, tfds_cache, tiny_tokenizer, num_train_steps=10,
                           **{**over, "data.pretokenize": False})
  config = json.loads((run / "config.json").read_text())
  del config["data"]["pretokenize"], config["data"]["num_workers"]  # (as an older run wrote)
  (run / "config.json").write_text(json.dumps(config))
  with caplog.at_level(logging.INFO, logger="transformer_jax"):
    helpers.train_in_process(run, tfds_cache, tiny_tokenizer, **over)  # default: pretokenize
  assert "Resuming from step 10" in caplog.text
  assert "config.data.pretokenize=True differs from the False this run was trained with" in (
      caplog.text)
  assert helpers.checkpoint_steps(run) == [10, 20]
  assert json.loads((run / "config.json").read_text())["data"]["pretokenize"] is False


def test_only_a_better_validation_writes_the_best_checkpoint(tiny_run, tfds_cache, tmp_path,
                                                            monkeypatch):
  """What a validation must beat is the saved best checkpoint's BLEU, also after a kill that
  logged a better validation (99 here) whose best checkpoint it never wrote."""
  run_dir = helpers.copy_run(tiny_run, tmp_path / "run")
  saved_best = helpers.logged(tiny_run, "eval/bleu", helpers.checkpoint_steps(
      tiny_run, "checkpoints_best")[0])
  with (run_dir / "metrics.jsonl").open("a") as f:
    f.write(json.dumps({"step": 20, "eval/bleu": 99.0}) + "\n")
  config = helpers.tiny_config(**{"data.cache_dir": str(tfds_cache)})
  bleus = iter([saved_best + 1, saved_best, saved_best + 1, saved_best + 2])
  monkeypatch.setattr(validation, "validate", lambda *args: next(bleus))
  with open_run(from_config_dict(config), run_dir, config.to_dict()) as run:
    assert run.tally.best_bleu == pytest.approx(saved_best)
    saved = []
    monkeypatch.setattr(run.best_ckpt, "save", lambda step, *a, **k: saved.append(step))
    for step in (21, 22, 23, 24):
      run.validate(step)
  assert saved == [21, 24]
