"""Sweeps on a real PostgreSQL server (throwaway, on 127.0.0.1): a wrong password is one line
naming the host; workers started at the same instant on a fresh database all join the study;
two sweep workers share a study while one is SIGKILLed mid-trial and restarted."""

import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from tests import helpers, postgres, sweeps
from transformer_jax.cli import sweep as sweep_cli
from transformer_jax.reporting.metrics import read_metrics

pytestmark = pytest.mark.skipif(not postgres.available(),
                                reason=f"no PostgreSQL server programs in {postgres.BIN}")

OPEN = """
import sys
from pathlib import Path
from transformer_jax.sweeps import study
storage = study.open_storage(sys.argv[1], 60, 120, 1)
print("joined", len(storage.get_all_studies()))
"""


@pytest.fixture(scope="module")
def server():
  with postgres.Server() as db:
    yield db


def test_a_wrong_password_is_one_line_naming_the_host(server):
  from transformer_jax.errors import UsageError
  from transformer_jax.sweeps import study
  server.create_database("login")
  with pytest.raises(UsageError, match=rf"--storage=postgresql\+psycopg2://postgres:\*\*\*@"
                                       rf"127.0.0.1:{server.port}/login: cannot connect to "
                                       rf"127.0.0.1:{server.port}: .*password authentication "
                                       "failed"):
    study.open_storage(server.url("login", password="wrong"), 60, 120, 1)


def test_workers_starting_at_the_same_instant_on_a_fresh_database_all_join(server):
  server.create_database("fresh")
  procs = [subprocess.Popen([sys.executable, "-c", OPEN, server.url("fresh")], cwd=helpers.ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for _ in range(4)]
  results = [p.communicate(timeout=120) for p in procs]
  for p, (out, err) in zip(procs, results):
    assert p.returncode == 0, err[-2000:]
    assert out.strip() == "joined 0"


def _past_step_4(workdir) -> bool:
  """Whether a trial in `workdir` has trained past its checkpoint of step 4."""
  return any(m.get("step", 0) >= 4 and "train/loss" in m
             for path in workdir.glob("trials/*/metrics.jsonl") for m in read_metrics(path))


def test_two_workers_one_killed_mid_trial_and_restarted(server, tfds_cache, tiny_tokenizer,
                                                        tmp_path):
  """Two workers (own workdirs, as on two machines) on one study; worker 1 is SIGKILLed
  mid-trial and started again. The budget is exact, no trial runs twice, the killed trial is
  rerun from its checkpoint, and either worker's --report_only prints the same table."""
  server.create_database("sweeps")
  url = server.url("sweeps")
  lrs = [1e-2, 3e-3, 1e-3]
  workdirs = [tmp_path / "worker1", tmp_path / "worker2"]
  commands = []
  for workdir in workdirs:
    workdir.mkdir()
    shutil.copy(tiny_tokenizer, workdir / "spm.model")  # (the trials' shared tokenizer)
    commands.append(sweeps.command(tmp_path, tfds_cache, lrs, "--sweep.pruner=none",
                                   f"--storage={url}", "--study_name=pg", workdir=workdir))
  start = lambda cmd: subprocess.Popen(cmd, cwd=helpers.ROOT, stdout=subprocess.PIPE,  # noqa
                                       stderr=subprocess.PIPE, text=True)
  first, second = start(commands[0]), start(commands[1])
  sweeps.wait_for(lambda: _past_step_4(workdirs[0]), what="worker 1's trial to pass step 4")
  first.send_signal(signal.SIGKILL)
  first.communicate()
  restarted = start(commands[0])
  for proc in (second, restarted):
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]

  trials = optuna.load_study(study_name="pg", storage=url).get_trials()
  assert sorted(t.state.name for t in trials) == ["COMPLETE"] * 3 + ["FAIL"]
  done = [t for t in trials if t.state.name == "COMPLETE"]
  assert sorted(t.params["optimizer.learning_rate"] for t in done) == sorted(lrs)
  (killed,) = [t for t in trials if t.state.name == "FAIL"]
  (rerun,) = [t for t in trials if t.user_attrs.get("retry_of") is not None]
  assert rerun.user_attrs["retry_of"] == killed.number and rerun.params == killed.params
  assert rerun.user_attrs["workdir"] == killed.user_attrs["workdir"]
  assert killed.user_attrs["workdir"].startswith(str(workdirs[0]))
  log_text = (Path(killed.user_attrs["workdir"]) / "train.log").read_text()
  assert re.search(r"Resuming from step [1-9]", log_text)
  assert log_text.count("Model:") == 2  # the killed run and its rerun, nothing more
  for t in done:
    if t is not rerun:
      assert (Path(t.user_attrs["workdir"]) / "train.log").read_text().count(
          "Model:") == 1

  # (in this process: the report reads the study, as a worker on either machine would)
  tables = [helpers.run_tool(sweep_cli.main, *cmd[3:], "--report_only") for cmd in commands]
  for status, _, err in tables:
    assert status == 0, err[-3000:]
  assert "4 trials (3 complete, 1 failed); eval/loss: minimize" in tables[0][1]
  assert tables[0][1] == tables[1][1]
