"""Sweeps end to end on the tiny config: pruning, the report and the best command, a worker
killed midway and restarted, two workers sharing one SQLite study, and atomic trial claims."""

import json
import multiprocessing
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import optuna
import pytest

from tests import sweeps
from tests.helpers import ROOT, assert_bitwise_equal, saved_state
from tests.sweep_claims import claim_all
from transformer_jax.reporting.metrics import read_metrics
from transformer_jax.sweeps import study as sweep
from transformer_jax.training.preemption import ENV as FAULTS_ENV


@pytest.fixture()
def cache_dir(tfds_cache, tiny_tokenizer, tmp_path):
  """The shared TFDS cache; the sweep's shared tokenizer already in place (its first trial
  would train the same one)."""
  (tmp_path / "sweep").mkdir()
  shutil.copy(tiny_tokenizer, tmp_path / "sweep" / "spm.model")
  return tfds_cache


_sweep_cmd = sweeps.command
_wait_for = sweeps.wait_for


def _trials(workdir):
  storage = optuna.storages.RDBStorage(f"sqlite:///{workdir / 'study.db'}")
  return optuna.load_study(study_name="spec", storage=storage).get_trials()


def test_sweep_prunes_reports_and_best_command_reproduces(tmp_path, cache_dir):
  # lr 1e-6 learns nothing in 2 steps: worse than both finished trials at step 2 -> pruned.
  r = subprocess.run(_sweep_cmd(tmp_path, cache_dir, [1e-2, 3e-3, 1e-6]), cwd=ROOT,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  workdir = tmp_path / "sweep"
  trials = _trials(workdir)
  assert [t.state.name for t in trials] == ["COMPLETE", "COMPLETE", "PRUNED"]
  assert trials[2].user_attrs["steps"] < 6
  assert "3 trials (2 complete, 1 pruned); eval/loss: minimize" in r.stdout

  # The table: CSV and JSON rows match the study.
  rows = (workdir / "results.csv").read_text().splitlines()
  assert rows[0].startswith("trial,state,objective,p_vs_best,steps,wall_time_s,"
                          "optimizer.learning_rate")
  assert len(rows) == 4
  summary = json.loads((workdir / "results.json").read_text())
  best = min(trials[:2], key=lambda t: t.value)
  assert summary["best"]["trial"] == best.number
  assert summary["best"]["objective"] == best.value
  assert [row["state"] for row in summary["trials"]] == ["complete", "complete", "pruned"]
  for name in ("objective_vs_params.png", "objective_by_trial.png"):
    assert (workdir / name).stat().st_size > 10_000

  # The best command, rerun in a fresh workdir, gives the same objective (deterministic CPU).
  argv = summary["best"]["command"]
  assert f"--workdir={workdir / 'best_rerun'}" == argv[-1]
  assert argv[-1] in (workdir / "best_command.sh").read_text()
  rerun = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  losses = [m["eval/loss"] for m in read_metrics(workdir / "best_rerun" / "metrics.jsonl")
            if "eval/loss" in m]
  assert losses[-1] == best.value


def _trial_processes(marker: str) -> list[int]:
  pids = []
  for pid in os.listdir("/proc"):
    try:
      cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (OSError, ValueError):
      continue
    if marker in cmdline and "transformer_jax.cli.train" in cmdline:
      pids.append(int(pid))
  return pids


def test_killed_sweep_continues_without_repeating_finished_trials(tmp_path, cache_dir):
  cmd = _sweep_cmd(tmp_path, cache_dir, [1e-2, 3e-3])
  workdir = tmp_path / "sweep"
  trial1 = workdir / "trials" / "0001"
  worker = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  # Kill the worker (SIGKILL: no cleanup) once trial 1 has trained past its first checkpoint.
  _wait_for(lambda: any(m.get("step", 0) >= 4 and "train/loss" in m
                        for m in read_metrics(trial1 / "metrics.jsonl")),
            what="trial 1 to reach step 4")
  worker.send_signal(signal.SIGKILL)
  worker.wait()
  # Its training process dies with it (PR_SET_PDEATHSIG), leaving the checkpoints behind.
  _wait_for(lambda: not _trial_processes(str(trial1)), timeout_s=60,
            what="the orphaned trial process to exit")
  saved = sorted(int(p.name) for p in (trial1 / "checkpoints").iterdir() if p.name.isdigit())
  assert saved, "no checkpoint was written before the kill"
  assert [t.state.name for t in _trials(workdir)] == ["COMPLETE", "RUNNING"]

  r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  trials = _trials(workdir)
  # Trial 0 is not repeated; trial 1 (heartbeat stale) is failed and rerun as trial 2, in its
  # own workdir, resuming from its last checkpoint.
  assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"]
  assert trials[2].params == trials[1].params
  assert trials[2].user_attrs["retry_of"] == 1
  assert trials[2].user_attrs["workdir"] == str(trial1)
  assert (workdir / "trials" / "0000" / "train.log").read_text().count("Model:") == 1
  assert f"Resuming from step {saved[-1]}" in (trial1 / "train.log").read_text()
  assert not (workdir / "trials" / "0002").exists()


# Validation at steps 4 and 6 on 8 sentences in batches of one; the test's fault injection
# (slow_validation@4) waits before each batch of step 4's: time enough for a worker to die in
# the middle of it, without decoding a whole validation split.
LONG_EVAL_SPEC = sweeps.SPEC.replace('"eval_every_steps": 2', '"eval_every_steps": 4').replace(
    '"eval_max_sentences": 8', '"eval_max_sentences": 8, "decode": {{"batch_size": 1}}')


def _lock_trace(log_text: str) -> list[tuple[str, int]]:
  """The workdir lock's takings and releases, in the order the processes logged them."""
  return [(m.group(1), int(m.group(2))) for m in
          re.finditer(r"Workdir lock (taken|released) by pid (\d+)", log_text)]


def test_a_worker_killed_during_a_long_evaluation_never_leaves_two_writers(tmp_path,
                                                                           cache_dir):
  """The worker dies mid-validation; its orphaned run gets SIGTERM, stops the validation at
  the next batch, saves and exits; the rerun, started at once, waits for the workdir's lock,
  validates the saved step first, and ends with the parameters of an undisturbed run."""
  cmd = _sweep_cmd(tmp_path, cache_dir, [1e-2], "--sweep.pruner=none",
                   template=LONG_EVAL_SPEC)
  workdir = tmp_path / "sweep"
  trial0 = workdir / "trials" / "0000"
  env = {**os.environ, FAULTS_ENV: "slow_validation@4"}
  worker = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
  _wait_for(lambda: (trial0 / "train.log").is_file()
            and "step 4: validating" in (trial0 / "train.log").read_text(),
            what="trial 0's validation of step 4")
  worker.send_signal(signal.SIGKILL)
  worker.wait()
  r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]

  trials = _trials(workdir)
  assert [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
  assert trials[1].user_attrs["retry_of"] == 0
  assert trials[1].user_attrs["workdir"] == str(trial0)
  text = (trial0 / "train.log").read_text()  # (both runs write it, in time order)
  trace = _lock_trace(text)
  assert [what for what, _ in trace] == ["taken", "released", "taken", "released"], trace
  (_, orphan), _, (_, rerun), _ = trace
  assert orphan != rerun and trace[1][1] == orphan and trace[3][1] == rerun
  assert "SIGTERM during the validation of step 4: validation stopped" in text
  assert "Resuming from step 4" in text and "Validating step 4 first" in text
  records = read_metrics(trial0 / "metrics.jsonl")
  assert [m["step"] for m in records if "eval/loss" in m] == [4, 6]

  # The same trial undisturbed, from its recorded command: the same final parameters.
  argv = shlex.split(trials[1].user_attrs["command"])
  alone = tmp_path / "alone"
  assert argv[-1] == f"--workdir={trial0}"
  undisturbed = subprocess.run([*argv[:-1], f"--workdir={alone}"], cwd=ROOT,
                               capture_output=True, text=True, timeout=300)
  assert undisturbed.returncode == 0, undisturbed.stderr[-3000:]
  assert_bitwise_equal(saved_state(trial0), saved_state(alone))


def test_a_worker_signalled_twice_fails_and_requeues_its_trial(tmp_path, cache_dir):
  """SIGTERM twice in quick succession (a shell's `timeout` then Ctrl-C, Slurm's group
  signals): the trial is still marked failed and requeued at once, not left RUNNING."""
  cmd = _sweep_cmd(tmp_path, cache_dir, [1e-2], "--sweep.pruner=none")
  workdir = tmp_path / "sweep"
  trial0 = workdir / "trials" / "0000"
  worker = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
  _wait_for(lambda: any("train/loss" in m for m in read_metrics(trial0 / "metrics.jsonl")),
            what="trial 0 to train")
  worker.send_signal(signal.SIGTERM)
  time.sleep(0.3)
  worker.send_signal(signal.SIGTERM)
  _, err = worker.communicate(timeout=120)
  assert worker.returncode != 0 and "sweep interrupted" in err.strip().splitlines()[-1]
  trials = _trials(workdir)
  assert [t.state.name for t in trials] == ["FAIL", "WAITING"], err[-2000:]
  assert trials[0].user_attrs["error"] == "worker interrupted"


def test_two_workers_share_the_study_without_running_a_trial_twice(tmp_path, cache_dir):
  cmd = _sweep_cmd(tmp_path, cache_dir, [1e-2, 3e-3, 1e-3], "--sweep.pruner=none")
  workers = [subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
  outputs = [w.communicate(timeout=600) for w in workers]
  for w, (_, err) in zip(workers, outputs):
    assert w.returncode == 0, err[-3000:]
  trials = _trials(tmp_path / "sweep")
  assert [t.state.name for t in trials] == ["COMPLETE"] * 3
  assert sorted(t.params["optimizer.learning_rate"] for t in trials) == [1e-3, 3e-3, 1e-2]
  for t in trials:  # each trial's training ran exactly once
    assert Path(t.user_attrs["workdir"], "train.log").read_text().count("Model:") == 1
  assert len({t.user_attrs["pid"] for t in trials}) == 2  # both workers took trials


def test_claiming_a_waiting_trial_is_atomic_across_processes(tmp_path):
  url = f"sqlite:///{tmp_path / 'study.db'}"
  storage = sweep.open_storage(url, 60, 120, 0)
  study = optuna.create_study(study_name="race", storage=storage)
  for _ in range(150):
    study.enqueue_trial({})
  ctx = multiprocessing.get_context("spawn")
  queue = ctx.Queue()
  procs = [ctx.Process(target=claim_all, args=(url, "race", queue)) for _ in range(3)]
  for p in procs:
    p.start()
  claimed = [queue.get(timeout=300) for _ in procs]
  for p in procs:
    p.join()
  every = sorted(n for c in claimed for n in c)
  assert every == list(range(150))  # each trial claimed once, none lost


POPULATION_SPEC = sweeps.SPEC.replace(
    's.sampler = "grid"', 's.sampler = "grid"\n  s.population = 4').replace(
    '"num_train_steps": 6', '"num_train_steps": 4').replace(
    '"optimizer": {{"warmup_steps": 1}}',
    '"optimizer": {{"warmup_steps": 1}}, "population": {{"program": "vmapped"}}')


def test_a_population_sweep_killed_and_resumed_runs_each_trial_once(tmp_path, cache_dir):
  """8 trials as two populations of 4. The second's member with learning rate 1e-6 is pruned
  (told so at once, masked by its population at its next validation); the worker is then
  SIGKILLed during step 4 (its population, signalled, saves step 4). The rerun reruns the
  second population's three unfinished trials together, resuming its run with all four
  members (the pruned one stays stopped): each grid point finished exactly once."""
  lrs = [1e-2, 3e-3, 5e-3, 2e-3, 1e-6, 7e-3, 4e-3, 6e-3]
  cmd = _sweep_cmd(tmp_path, cache_dir, lrs, template=POPULATION_SPEC)
  workdir = tmp_path / "sweep"
  second = workdir / "populations" / "0004"
  worker = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  _wait_for(lambda: (second / "members" / "0" / "stop_request").is_file()
            and any(m["step"] >= 3 and "train/loss" in m
                    for m in read_metrics(second / "members" / "1" / "metrics.jsonl")),
            what="trial 4 pruned and the second population past step 2")
  worker.send_signal(signal.SIGKILL)
  worker.wait()
  _wait_for(lambda: not _trial_processes(str(second)), timeout_s=60,
            what="the orphaned population to exit")
  assert [t.state.name for t in _trials(workdir)] == ["COMPLETE"] * 4 + ["PRUNED"] + [
      "RUNNING"] * 3

  r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  trials = _trials(workdir)
  assert [t.state.name for t in trials] == (["COMPLETE"] * 4 + ["PRUNED"] + ["FAIL"] * 3
                                            + ["COMPLETE"] * 3)
  finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED")]
  assert sorted(t.params["optimizer.learning_rate"] for t in finished) == sorted(lrs)
  for rerun, original in zip(trials[8:], trials[5:8]):
    assert rerun.user_attrs["retry_of"] == original.number
    assert rerun.user_attrs["population"] == str(second)
    assert rerun.user_attrs["member"] == original.user_attrs["member"]
    assert rerun.user_attrs["workdir"] == str(second / "members" / str(rerun.user_attrs["member"]))
    assert len([m for m in read_metrics(Path(rerun.user_attrs["workdir"]) / "metrics.jsonl")
                if "eval/loss" in m]) == 2  # (steps 2 and 4, each once)
  assert sorted(p.name for p in (workdir / "populations").iterdir()) == ["0000", "0004"]
  assert (workdir / "populations" / "0000" / "train.log").read_text().count("Population of") == 1
  log = (second / "train.log").read_text()  # (the orphaned run got SIGTERM and saved)
  assert "Resuming from step 4" in log and "member 0: stopped at step 4" in log
  assert os.readlink(workdir / "trials" / "0006") == "../populations/0004/members/2"
  # A member's best command trains it alone, in the population's batch order.
  summary = json.loads((workdir / "results.json").read_text())
  assert "--config.data_seed=0" in summary["best"]["command"]
