"""Two processes × 2 fake CPU devices (jax.distributed on 127.0.0.1) train like one process
with 4 devices, and their collectively written checkpoint restores in one process."""

import json
import shutil
import subprocess
import sys

import pytest

from tests import helpers
from tests.helpers import ROOT

SCRIPT = r"""
import functools, json, sys
import jax, numpy as np
sys.path.insert(0, ".")
port, process_id, num_processes, workdir, restore_from = sys.argv[1:]
if int(num_processes) > 1:
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}",
                             num_processes=int(num_processes), process_id=int(process_id))
from transformer_jax.configs import tiny
from tests.helpers import fixed_batch
from transformer_jax.config.parse import from_config_dict
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import mesh as sharding
from transformer_jax.training import state as state_lib, step as step_lib
from transformer_jax.workdir import checkpoints

c = tiny.get_config()
c.model.dropout_rate = 0.0
c.model.num_encoder_layers = c.model.num_decoder_layers = 1  # (depth plays no part here)
c.parallelism.mesh_shape = (2, 2, 1)   # data x fsdp over all 4 devices (both hosts)
cfg = from_config_dict(c)
model = Transformer(cfg.model)
assert jax.device_count() == 4 and jax.local_device_count() == 4 // int(num_processes)
mesh = sharding.make_mesh(cfg.parallelism)
state, state_sharding = state_lib.create_state(cfg, model, mesh, jax.random.PRNGKey(0))
ckpt = checkpoints.Checkpointer(f"{workdir}/checkpoints", 3)
digest = lambda s: [float(np.asarray(sharding.fetch(x), np.float64).sum())
                    for x in jax.tree_util.tree_leaves(s.params)]
step = jax.jit(functools.partial(step_lib.train_step, model=model, label_smoothing=0.1),
               in_shardings=(state_sharding, sharding.batch_sharding(mesh),
                             sharding.replicated(mesh)),
               out_shardings=(state_sharding, sharding.replicated(mesh)))
losses = []
for i in range(3):
  full = fixed_batch(seed=i)   # 8 global rows; each host feeds its own 8 / processes
  rows = 8 // jax.process_count()
  local = {k: v[jax.process_index() * rows:(jax.process_index() + 1) * rows]
           for k, v in full.items()}
  state, m = step(state, sharding.global_batch(local, mesh), jax.random.PRNGKey(7))
  losses.append(float(m["loss_sum"] / m["num_tokens"]))
ckpt.save(3, state)
ckpt.close()
out = {"losses": losses, "digest": digest(state)}
if restore_from:  # then restore what another run wrote
  other = checkpoints.Checkpointer(f"{restore_from}/checkpoints", 3)
  restored = other.restore(other.latest_step(), checkpoints.abstract_like(state))
  out["restored"] = {"step": int(restored.step), "digest": digest(restored)}
  other.close()
if jax.process_index() == 0:
  print("RESULT " + json.dumps(out))
"""


def _run(num_processes, devices_each, workdir, restore_from=""):
  env = helpers.xla_env(devices_each)
  port = str(helpers.free_port())
  procs = [subprocess.Popen([sys.executable, "-c", SCRIPT, port, str(i), str(num_processes),
                             str(workdir), str(restore_from)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(num_processes)]
  outputs = [p.communicate(timeout=600) for p in procs]
  for p, (_, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
  line = [x for x in outputs[0][0].splitlines() if x.startswith("RESULT ")][-1]
  return json.loads(line[len("RESULT "):])


def test_two_processes_train_like_one_and_their_checkpoint_restores_in_one(tmp_path):
  two = _run(2, 2, tmp_path / "two")
  # One process with the same 4 devices trains, then restores what the two wrote together.
  one = _run(1, 4, tmp_path / "one", restore_from=tmp_path / "two")
  assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)
  assert one["losses"][2] < one["losses"][0]
  assert one["restored"]["step"] == 3
  assert one["restored"]["digest"] == two["digest"]  # bit for bit


def _train_on_two_hosts(run, tfds_cache, tiny_tokenizer, fault_on_process_1: str, flags):
  """train.py on the tiny config as 2 processes × 2 CPU devices (jax.distributed on
  127.0.0.1), `fault_on_process_1` injected into process 1 only; asserts both exit 0 and
  returns their stderr (both are killed if they outlast the timeout)."""
  port = str(helpers.free_port())
  run.mkdir()
  shutil.copy(tiny_tokenizer, run / "spm.model")
  procs = []
  for i in range(2):
    env = helpers.xla_env(2)
    env["TRANSFORMER_JAX_FAULTS"] = fault_on_process_1 if i == 1 else ""
    procs.append(subprocess.Popen(
        [sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={run}",
         f"--config.data.cache_dir={tfds_cache}", *helpers.ONE_LAYER_FLAGS, *flags,
         f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2", f"--process_id={i}"],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  try:
    outputs = [p.communicate(timeout=300) for p in procs]
  finally:
    for p in procs:
      p.kill()
  for p, (_, err) in zip(procs, outputs):
    assert p.returncode == 0, err[-3000:]
  return [err for _, err in outputs]


def test_sigterm_on_one_host_stops_both_at_the_same_step_with_a_checkpoint(tmp_path, tfds_cache,
                                                                          tiny_tokenizer):
  """JAX's preemption service: SIGTERM reaches process 1 only; both processes agree on the
  step, save one checkpoint there collectively, and exit cleanly. (With dtype "auto", which
  both resolve to process 0's choice, as config.json records.)"""
  errs = _train_on_two_hosts(tmp_path / "run", tfds_cache, tiny_tokenizer, "sigterm@5", [
      "--config.num_train_steps=1000", "--config.model.dtype=auto",
      "--config.checkpoint_every_steps=1000",  # (only the preemption saves)
      "--config.eval_every_steps=1000", "--config.log_every_steps=1"])
  saved = []
  for err in errs:
    lines = [x for x in err.splitlines() if "Preempted: checkpoint saved at step" in x]
    assert len(lines) == 1, err[-3000:]
    saved.append(int(lines[0].split("at step ")[1].split()[0]))
  assert saved[0] == saved[1] >= 5  # the same step on both hosts, not before the signal
  resolved = [[x.split("resolved to ")[1].split(":")[0] for x in err.splitlines()
               if "config.model.dtype=auto resolved to" in x] for err in errs]
  recorded = json.loads((tmp_path / "run" / "config.json").read_text())["model"]["dtype"]
  assert resolved[0] == resolved[1] == [recorded] and recorded in ("float32", "bfloat16")
  steps = sorted(int(p.name) for p in (tmp_path / "run" / "checkpoints").iterdir()
                 if p.name.isdigit())
  assert steps == [saved[0]]


def test_a_host_whose_clock_runs_fast_stops_with_the_others_at_the_same_step(tmp_path, tfds_cache,
                                                                              tiny_tokenizer):
  """The time budget follows process 0's clock on every host: process 1's clock runs 600 times
  fast (fault injection), which alone would end its budget at its first step and leave
  process 0 waiting in the next collective. Both must stop at the same step with the same
  cooldown factor."""
  errs = _train_on_two_hosts(tmp_path / "run", tfds_cache, tiny_tokenizer, "fast_clock@600", [
      "--config.num_train_steps=100000", "--config.time_budget_minutes=0.25",
      "--config.optimizer.cooldown_fraction=0.5", "--config.log_every_steps=5",
      "--config.checkpoint_every_steps=100000", "--config.eval_every_steps=100000"])
  stops = []
  for err in errs:
    stops.append([x.split("training ended at step ")[1].split(" (")[0] for x in err.splitlines()
                  if "Time budget of 0.25 minutes spent" in x])
  assert stops[0] == stops[1] and len(stops[0]) == 1, stops  # "N of 100000, factor F"
  assert int(stops[0][0].split()[0]) >= 5  # past the first logging step on both
