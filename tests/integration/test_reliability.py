"""Fault injection into real training runs (train.py on the tiny config): SIGKILL and SIGTERM
at exact steps, damaged checkpoints, a checkpoint of another model, non-finite gradients.

Faults come from TRANSFORMER_JAX_FAULTS (transformer_jax/training/preemption.py) at fixed
steps, so every outcome is deterministic. Final states are compared bit for bit with an
uninterrupted run.
"""

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from tests import builders, helpers, marian
from tests.helpers import ROOT
from tests.helpers import assert_bitwise_equal as _assert_bitwise_equal
from tests.helpers import checkpoint_steps as _steps
from tests.helpers import saved_state as _state
from transformer_jax.data import corpus
from transformer_jax.errors import CheckpointError
from transformer_jax.inference import averaging, trained_run
from transformer_jax.interop import hf_marian

STEPS = builders.RELIABILITY_STEPS


@pytest.fixture()
def train(tfds_cache, tiny_tokenizer):
  """train.py on the tiny config with the reliability tests' schedule (12 steps, checkpoints
  every 4)."""
  return lambda workdir, *overrides, **kw: helpers.train_process(
      workdir, tfds_cache, *STEPS, *overrides, tokenizer=tiny_tokenizer, **kw)


def _assert_finite(state, step):
  """(A run with a fault compiled in runs another XLA program, whose rounding Adam amplifies
  in near-zero gradients: such runs are not compared bit for bit with the reference.)"""
  assert int(state["step"]) == step
  for x in jax.tree_util.tree_leaves(state):
    assert np.isfinite(np.asarray(x, np.float64)).all()


@pytest.fixture(scope="session")
def reference():
  """An uninterrupted 12-step run (checkpoints at 4, 8, 12), trained once per test run (in the
  background: tests/builders.py)."""
  return builders.get("reliability_reference") / "reference"


def test_sigterm_then_sigkill_then_rerun_end_bitwise_equal(reference, train, tmp_path):
  ref = reference
  run = tmp_path / "run"
  # Preemption after step 6: a checkpoint at step 6 (not a multiple of 4), clean exit.
  r = train(run, fault="sigterm@6")
  assert "Preempted: checkpoint saved at step 6" in r.stderr
  assert _steps(run) == [4, 6]
  # Restarted, then killed outright after step 10: nothing saved after step 8 (whose save,
  # written in the background, may not have been complete by then).
  r = train(run, fault="sigkill@10", check=False)
  assert r.returncode == -signal.SIGKILL
  assert "Resuming from step 6" in r.stderr
  assert json.loads((run / ".lock").read_text())["pid"] > 0  # the killed run's lock, left
  assert _steps(run) in ([4, 6, 8], [4, 6])
  latest = _steps(run)[-1]
  # The same command again: the steps after it redone from its state, RNG and data position.
  r = train(run)
  assert f"Resuming from step {latest}" in r.stderr
  assert "taken over (it is no longer running)" in r.stderr  # (flock died with its process)
  _assert_bitwise_equal(_state(run), _state(ref))
  # One record per logged step, though steps 9-10 (or 7-10) were logged twice: the records
  # past the restored checkpoint were dropped at each resume.
  logged = [rec["step"] for rec in helpers.read_metrics(run) if "train/loss" in rec]
  assert logged == [2, 4, 6, 8, 10, 12]


def test_a_second_train_on_a_running_workdir_stops_at_once_naming_the_first(
    reference, tfds_cache, tiny_tokenizer, tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  shutil.copy(tiny_tokenizer, run / "spm.model")
  cmd = [sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={run}",
         f"--config.data.cache_dir={tfds_cache}", *STEPS]
  first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
  deadline = time.time() + 120
  while time.time() < deadline and f'"pid": {first.pid}' not in _lock_text(run):
    time.sleep(0.2)
  t0 = time.time()
  second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert second.returncode != 0 and time.time() - t0 < 30
  message = second.stderr.strip().splitlines()[-1]
  assert f"is in use by pid {first.pid} on" in message and "(train, since" in message
  _, err = first.communicate(timeout=300)
  assert first.returncode == 0, err[-3000:]
  _assert_bitwise_equal(_state(run), _state(reference))  # the first run, undisturbed
  assert _lock_text(run) == ""  # released at its end


def test_a_full_disk_at_a_save_is_one_line_and_keeps_the_earlier_checkpoint(reference, train,
                                                                            tmp_path):
  run = tmp_path / "run"
  r = train(run, fault="enospc_saving@8", check=False)
  assert r.returncode == 1
  last = r.stderr.strip().splitlines()[-1]
  assert last == (f"train: cannot write {run.absolute() / 'checkpoints' / '8'}: No space left "
                  "on device (everything saved before it is kept)"), last
  assert _steps(run) == [4]
  _assert_bitwise_equal(_state(run, 4), _state(reference, 4))


def test_a_truncated_tokenizer_is_one_line_naming_it_and_its_fingerprint(reference, train,
                                                                          tmp_path):
  run = shutil.copytree(reference, tmp_path / "run")
  fingerprint = json.loads((run / "tokenizer.json").read_text())["fingerprint"]
  model = run / "spm.model"
  model.write_bytes(model.read_bytes()[:1000])
  r = train(run, "--config.num_train_steps=16", check=False)
  e = subprocess.run([sys.executable, "-m", "transformer_jax.cli.evaluate", f"--workdir={run}",
                      "--split=val", "--max_sentences=4"], cwd=ROOT, capture_output=True,
                     text=True, timeout=300)
  for tool, result in (("train", r), ("evaluate", e)):
    assert result.returncode == 1
    message = helpers.one_line_error(result.stderr)
    assert message.startswith(f"{tool}: tokenizer {model} is damaged or not a SentencePiece "
                              "model"), message
    assert message.endswith(f"{run / 'tokenizer.json'} records its fingerprint: "
                            f"{fingerprint}"), message
  for step in (4, 8, 12):
    _assert_bitwise_equal(_state(run, step), _state(reference, step))


@pytest.fixture()
def tmpfs(tmp_path):
  """A small tmpfs of its own (8 MB), unmounted at the end; skipped where mounting is not
  allowed (not root, or a container without CAP_SYS_ADMIN): the injected ENOSPC above and the
  write probe's unit tests cover the same code there."""
  mount_point = tmp_path / "tmpfs"
  mount_point.mkdir()
  r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
                     capture_output=True, text=True)
  if r.returncode != 0:
    pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip() or r.returncode}")
  try:
    yield mount_point
  finally:
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill_leaving(folder, free_bytes: int):
  """Fills `folder`'s filesystem with one file, leaving about `free_bytes` free."""
  st = os.statvfs(folder)
  with open(folder / "filler", "wb") as f:
    f.write(b"\0" * max(st.f_bavail * st.f_frsize - free_bytes, 0))


def test_a_read_only_workdir_is_one_line_before_any_work_and_loses_nothing(reference, train,
                                                                           tmpfs):
  run = shutil.copytree(reference, tmpfs / "run")
  subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
  r = train(run, "--config.num_train_steps=16", check=False)
  assert r.returncode == 1
  assert helpers.one_line_error(r.stderr) == (f"train: cannot write {run}: Read-only file "
                                              "system"), r.stderr[-2000:]
  assert "Model:" not in r.stderr  # (found before the model was built)
  e = subprocess.run([sys.executable, "-m", "transformer_jax.cli.evaluate", f"--workdir={run}",
                      "--split=val", "--max_sentences=4"], cwd=ROOT, capture_output=True,
                     text=True, timeout=300)
  assert e.returncode == 1 and "Read-only file system" in helpers.one_line_error(e.stderr)
  assert "cannot write" in helpers.one_line_error(e.stderr)
  for step in (4, 8, 12):
    _assert_bitwise_equal(_state(run, step), _state(reference, step))


def test_a_full_filesystem_at_a_save_is_one_line_and_loses_nothing(reference, train, tmpfs):
  run = shutil.copytree(reference, tmpfs / "run")
  _fill_leaving(tmpfs, 300_000)  # (the write probe passes; a 650 KB checkpoint does not fit)
  r = train(run, "--config.num_train_steps=16", check=False)
  assert r.returncode == 1
  message = helpers.one_line_error(r.stderr)
  assert re.fullmatch(rf"train: cannot write {run}/checkpoints(_best)?/16: No space left on "
                      r"device \(0\.\d MiB free, the checkpoint needs about \d\.\d MiB\) "
                      r"\(everything saved before it is kept\)", message), message
  assert _steps(run) == [4, 8, 12]
  for step in (4, 8, 12):
    _assert_bitwise_equal(_state(run, step), _state(reference, step))
  (tmpfs / "filler").unlink()  # space again: the run goes on from step 12
  train(run, "--config.num_train_steps=16")
  assert _steps(run)[-1] == 16


def _lock_text(workdir) -> str:
  try:
    return (workdir / ".lock").read_text()
  except FileNotFoundError:
    return ""


def test_sigkill_during_a_background_save_keeps_the_previous_checkpoint(reference, train,
                                                                        tmp_path):
  run = tmp_path / "run"
  # Killed right after the save of step 8 started: its arrays are on the host, the files not
  # complete; Orbax renames a checkpoint's folder into place only once it is complete.
  r = train(run, fault="sigkill_saving@8", check=False)
  assert r.returncode == -signal.SIGKILL
  assert "during the save of step 8" in r.stderr
  steps = _steps(run)
  assert steps[:1] == [4] and steps in ([4], [4, 8])
  _assert_bitwise_equal(_state(run, 4), _state(reference, 4))  # the previous one restores
  r = train(run)
  assert f"Resuming from step {steps[-1]}" in r.stderr
  _assert_bitwise_equal(_state(run), _state(reference))


def test_external_sigterm_saves_the_current_step_and_exits(tfds_cache, tiny_tokenizer, tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  shutil.copy(tiny_tokenizer, run / "spm.model")
  cmd = [sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={run}",
         f"--config.data.cache_dir={tfds_cache}", *STEPS, "--config.num_train_steps=100000"]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  metrics = run / "metrics.jsonl"
  deadline = time.time() + 240
  while not (metrics.is_file() and metrics.read_text().strip()):  # training has started
    assert proc.poll() is None and time.time() < deadline
    time.sleep(0.2)
  sent = time.time()
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  exit_s = time.time() - sent
  assert proc.returncode == 0, err[-3000:]
  saved = [int(line.split("checkpoint saved at step ")[1].split()[0])
           for line in err.splitlines() if "Preempted: checkpoint saved at step" in line]
  assert len(saved) == 1 and _steps(run)[-1] == saved[0] >= 2
  # Within the grace period schedulers give before SIGKILL (Kubernetes' default: 30 s; ~2 s
  # measured on the tiny model), with room for a loaded test machine.
  assert exit_s < 30, f"SIGTERM to exit took {exit_s:.1f} s (saved step {saved[0]})"


def test_sigterm_during_a_validation_stops_it_and_the_resumed_run_does_it_first(
    reference, train, tmp_path):
  """A preemption mid-evaluation is not made to wait for the evaluation: it stops at the next
  batch, the step is saved, and the resumed run validates that step before training on."""
  run = tmp_path / "run"
  evals = ["--config.eval_every_steps=4"]
  r = train(run, *evals, fault="sigterm_validating@8")
  assert "SIGTERM during the validation of step 8: validation stopped" in r.stderr
  assert "Preempted: checkpoint saved at step 8" in r.stderr
  assert _steps(run)[-1] == 8
  at_8 = [m for m in helpers.read_metrics(run) if m["step"] == 8]
  assert any("eval/cancelled" in m for m in at_8) and not any("eval/bleu" in m for m in at_8)

  r = train(run, *evals)
  assert "Validating step 8 first" in r.stderr and "Resuming from step 8" in r.stderr
  records = helpers.read_metrics(run)
  assert [m["step"] for m in records if "eval/bleu" in m] == [4, 8, 12]
  assert [m["step"] for m in records if "train/loss" in m] == [2, 4, 6, 8, 10, 12]
  _assert_bitwise_equal(_state(run), _state(reference))  # (evaluations do not touch training)


def test_the_moving_average_survives_sigkill_and_resume_bit_for_bit(train, tmp_path):
  ema = ["--config.optimizer.ema_decay=0.9"]
  ref, run = tmp_path / "ref", tmp_path / "run"
  r = train(ref, *ema)
  assert "Moving average of the parameters (decay 0.9)" in r.stderr
  assert train(run, *ema, fault="sigkill@6", check=False).returncode == -signal.SIGKILL
  train(run, *ema)
  state = _state(run)
  assert sorted(state) == ["ema_params", "opt_state", "params", "step"]
  _assert_bitwise_equal(state, _state(ref))
  # The tools translate with the moving average, or with the trained weights when asked.
  loaded = trained_run.load(run)
  (averaged,), (raw,) = loaded.select("latest"), loaded.select("latest:raw")
  assert averaged.label.endswith("_ema") and raw.label.endswith("_raw")
  _assert_bitwise_equal(loaded.params(averaged), state["ema_params"])
  _assert_bitwise_equal(loaded.params(raw), state["params"])
  with pytest.raises(CheckpointError, match="average keeps both the weights and their moving"):
    averaging.average_to_workdir(run, "average:2:raw", tmp_path / "avg")


MIXTURE_CONFIG = """
import ml_collections
from transformer_jax.configs import tiny

def get_config():
  config = tiny.get_config()
  config.data.corpora = ml_collections.ConfigDict({
      "multi30k": dict(weight=3.0), "first500": dict(data_dir="%s", weight=1.0)})
  return config
"""


def test_a_mixture_survives_sigkill_and_resume_bit_for_bit_with_its_counts(train, tmp_path):
  folder = tmp_path / "first500"
  folder.mkdir()
  for lang in ("de", "en"):
    lines = list(corpus.read_lines(corpus.EMBEDDED_MULTI30K / f"train.{lang}.gz"))[:500]
    (folder / f"train.{lang}").write_text("".join(x + "\n" for x in lines))
  config = tmp_path / "mixture.py"
  config.write_text(MIXTURE_CONFIG % folder)
  ref, run = tmp_path / "ref", tmp_path / "run"
  train(ref, config=str(config))
  r = train(run, config=str(config), fault="sigkill@6", check=False)
  assert r.returncode == -signal.SIGKILL
  train(run, config=str(config))
  _assert_bitwise_equal(_state(run), _state(ref))
  counts = [{k: v for k, v in rec.items() if k.startswith("data/")}
            for rec in helpers.read_metrics(run) if "train/loss" in rec]
  assert counts == [{k: v for k, v in rec.items() if k.startswith("data/")}
                    for rec in helpers.read_metrics(ref) if "train/loss" in rec]
  assert counts[-1]["data/corpus/multi30k/share"] == pytest.approx(0.75, abs=0.01)
  assert counts[-1]["data/corpus/first500/pairs"] > 0


def test_damaged_newest_checkpoints_fall_back_and_are_kept_aside(reference, train, tmp_path):
  ref = reference
  run = tmp_path / "run"
  shutil.copytree(ref, run)
  # Step 12: a data file of the state truncated; step 8: a file of the state missing.
  files12 = sorted((p for p in (run / "checkpoints/12/state").rglob("*") if p.is_file()),
                   key=lambda p: -p.stat().st_size)
  with open(files12[0], "r+b") as f:
    f.truncate(files12[0].stat().st_size // 2)
  (run / "checkpoints/8/state/_METADATA").unlink()
  r = train(run)
  assert "checkpoint at step 12" in r.stderr and "checkpoint at step 8" in r.stderr
  assert r.stderr.count("is damaged") == 2 and "resuming from step 4" in r.stderr
  assert "Resuming from step 4" in r.stderr
  # Both damaged copies kept (not deleted), and the run ends where the reference ended.
  assert sorted(p.name for p in (run / "checkpoints_damaged").iterdir()) == ["12", "8"]
  _assert_bitwise_equal(_state(run, 12), _state(ref, 12))


def test_checkpoint_of_another_model_is_an_error_not_damage(reference, train, tmp_path):
  ref = reference
  run = tmp_path / "run"
  shutil.copytree(ref, run)
  r = train(run, "--config.model.d_ff=128", check=False)
  assert r.returncode == 1
  line = helpers.one_line_error(r.stderr)
  assert line.startswith("train: checkpoint at step 12") and "does not match the config's " \
      "model" in line, line
  assert _steps(run) == [4, 8, 12] and not (run / "checkpoints_damaged").exists()
  assert (run / "config.json").read_text() == (ref / "config.json").read_text()  # not replaced


def test_nonfinite_gradient_stops_naming_the_step(train, tmp_path):
  run = tmp_path / "run"
  r = train(run, fault="nonfinite@6", check=False)
  assert r.returncode == 1
  assert helpers.one_line_error(r.stderr).startswith(
      "train: non-finite loss or gradient at step 6")
  assert "checkpoint (step 4" in r.stderr
  assert _steps(run) == [4]  # nothing saved after the bad step; step 4 restores, finite
  _assert_finite(_state(run, 4), 4)


def test_nonfinite_gradient_skipped_when_configured(train, tmp_path):
  run = tmp_path / "run"
  r = train(run, "--config.nonfinite_updates=skip", fault="nonfinite@6")
  assert "skipped 1 update(s) with a non-finite loss or gradient (first at step 6)" in r.stderr
  _assert_finite(_state(run, 12), 12)
  logged = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
  assert [r["train/skipped_steps"] for r in logged if r["step"] == 6] == [1]


def test_a_fine_tuning_run_killed_and_rerun_ends_bitwise_equal_to_one_run_alone(
    tfds_cache, tiny_tokenizer, tmp_path):
  """config.init_from, from a Hugging Face Marian model imported as a run (random weights):
  the rerun of a killed fine-tuning run resumes from its own checkpoint (not from the source's
  weights again), keeps the imported tokenizer, and ends as the run without the kill, even
  with the source deleted in between (it matters only at the run's start)."""
  marian.folder(tmp_path / "opus-mt-de-en", tiny_tokenizer, tiny_tokenizer, encoder_layers=1,
                decoder_layers=1, scale_embedding=True, activation_function="swish")
  source = hf_marian.import_run(tmp_path / "opus-mt-de-en", tmp_path / "imported", "de", "en")
  config = shutil.copy(source / "finetune.py", tmp_path / "finetune.py")
  source_tokenizer = (source / "spm.model").read_bytes()
  kernel = ["params", "decoder_0", "feed_forward", "wi", "kernel"]
  source_kernel = functools.reduce(dict.get, kernel, _state(source, 0))
  start = [*(f"--config.{k}={v}" for k, v in marian.TINY_DATA.items()), *STEPS,
           "--config.num_train_steps=8", "--config.checkpoint_every_steps=2",
           "--config.optimizer.learning_rate=0.001", "--config.optimizer.warmup_steps=4"]

  def train(workdir, **kw):
    return helpers.train_process(workdir, tfds_cache, *start, config=str(config), **kw)

  alone, killed = tmp_path / "alone", tmp_path / "killed"
  r = train(alone)
  assert "Initialised from" in r.stderr
  r = train(killed, fault="sigkill@7", check=False)
  assert r.returncode == -signal.SIGKILL
  saved = _steps(killed)  # (a save waits for the one before: step 6's may not be complete)
  assert saved in ([2, 4], [2, 4, 6])
  shutil.rmtree(source)
  r = train(killed)
  assert f"Resuming from step {saved[-1]}" in r.stderr and "Initialised from" not in r.stderr
  _assert_bitwise_equal(_state(killed), _state(alone))
  assert not np.array_equal(functools.reduce(dict.get, kernel, _state(alone)),
                            source_kernel)  # (trained)
  assert (killed / "spm.model").read_bytes() == source_tokenizer


def test_a_population_killed_and_rerun_ends_bit_for_bit_as_one_never_killed(train, tmp_path):
  """Two members (seeds, learning rates, moving-average decays) in one program: the stacked
  state, each member's checkpoint and each member's logged losses as an uninterrupted run's."""
  population = ["--config.population.seed=(0,1)", "--config.population.learning_rate=(3e-3,1e-3)",
                "--config.population.ema_decay=(0.9,0.8)",
                "--config.population.program=vmapped"]  # (one body to compile)
  ref, run = tmp_path / "ref", tmp_path / "run"
  r = train(ref, *population)
  assert "Population of 2 members (seed, learning_rate, ema_decay)" in r.stderr
  assert train(run, *population, fault="sigkill@6", check=False).returncode == -signal.SIGKILL
  assert all(_steps(run / "members" / str(i)) in ([], [4]) for i in range(2))
  train(run, *population)
  _assert_bitwise_equal(_state(run), _state(ref))
  for i in range(2):
    member, member_ref = run / "members" / str(i), ref / "members" / str(i)
    assert _steps(member) == _steps(member_ref) == [4, 8, 12]
    _assert_bitwise_equal(_state(member), _state(member_ref))
    losses = [(r["step"], r["train/loss"]) for r in helpers.read_metrics(member)
              if "train/loss" in r]
    assert losses == [(r["step"], r["train/loss"]) for r in helpers.read_metrics(member_ref)
                      if "train/loss" in r]
    assert [s for s, _ in losses] == [2, 4, 6, 8, 10, 12]  # (steps 5-6 logged once)
  assert _state(ref / "members" / "1")["step"] == 12
