"""Checkpoints: a failed save keeps every good one, checkpoints that all fail to restore are an
error that moves nothing, and selection strings name the checkpoints or say what is wrong."""

import errno
import shutil
from pathlib import Path

import grain
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import tiny_setup
from transformer_jax.errors import CheckpointError
from transformer_jax.workdir import checkpoints


def test_checkpoints_that_all_fail_to_restore_are_an_error_and_stay(tmp_path):
  ckpt = checkpoints.Checkpointer(tmp_path / "checkpoints", max_to_keep=2)
  for step in (1, 2):
    ckpt.save(step, {"w": jnp.zeros(3)})
  with pytest.raises(CheckpointError, match="no checkpoint in .* can be restored "
                                                        r"\(nothing was moved"):
    ckpt.restore_latest({"w": jax.ShapeDtypeStruct((3,), jnp.float32), "extra": 1.0})
  assert ckpt.all_steps() == [1, 2] and not (tmp_path / "checkpoints_damaged").exists()
  ckpt.close()


def test_a_checkpoint_deleted_while_it_is_restored_is_a_one_line_error(tmp_path, monkeypatch):
  """As when a running train's max_to_keep deletes the step `evaluate --output_dir` reads."""
  ckpt = checkpoints.Checkpointer(tmp_path / "checkpoints", max_to_keep=2)
  ckpt.save(1, {"w": jnp.zeros(3)})
  ckpt.wait()
  restore = ckpt.manager.restore

  def deleted_under_it(step, **kwargs):
    shutil.rmtree(tmp_path / "checkpoints" / str(step))
    return restore(step, **kwargs)
  monkeypatch.setattr(ckpt.manager, "restore", deleted_under_it)
  with pytest.raises(CheckpointError, match=r"^checkpoint step 1 in .* was deleted while it "
                                            r"was read \(a training run"):
    ckpt.restore(1, {"w": jax.ShapeDtypeStruct((3,), jnp.float32)})
  ckpt.close()


def test_failed_save_keeps_every_good_checkpoint(tmp_path, monkeypatch):
  state = {"w": jnp.arange(6, dtype=jnp.float32), "step": jnp.int32(0)}
  data_iter = iter(grain.MapDataset.range(100).to_iter_dataset())
  ckpt = checkpoints.Checkpointer(tmp_path / "checkpoints", max_to_keep=2)
  for step in (1, 2):
    next(data_iter)
    ckpt.save(step, {**state, "step": jnp.int32(step)}, data_iter)

  def broken_save(self, directory, item=None, args=None):  # fails after the state is written
    raise OSError("disk full (injected)")
  monkeypatch.setattr(grain.checkpoint.CheckpointHandler, "save", broken_save)
  with pytest.raises(OSError, match="disk full"):
    ckpt.save(3, {**state, "step": jnp.int32(3)}, data_iter)
  monkeypatch.undo()
  ckpt.close()
  ckpt = checkpoints.Checkpointer(tmp_path / "checkpoints", max_to_keep=2)
  assert ckpt.all_steps() == [1, 2]  # the failed step 3 neither listed nor evicting step 1
  step, restored = ckpt.restore_latest(checkpoints.abstract_like(state))
  assert step == 2 and int(restored["step"]) == 2
  ckpt.save(3, {**state, "step": jnp.int32(3)}, data_iter)  # a later save works
  assert ckpt.all_steps() == [2, 3]
  ckpt.close()


def test_selections_name_checkpoints_or_say_what_is_wrong():
  steps = [10, 20, 30]
  assert checkpoints.parse_selection("latest", steps) == [("step_30", [30])]
  assert checkpoints.parse_selection("all", steps) == [(f"step_{s}", [s]) for s in steps]
  assert checkpoints.parse_selection("average:2", steps) == [("average_last_2_to_30", [20, 30])]
  assert checkpoints.parse_selection("steps:10,30", steps) == [("average_10_30", [10, 30])]
  assert checkpoints.parse_selection("20", steps) == [("step_20", [20])]
  for bad, message in [("average:4", r"average:4 needs 1..3 checkpoints"),
                       ("average:x", r"--checkpoint=average:x: average:N needs a whole number N .*"
                                     "e.g. average:5"),
                       ("steps:10,x", r"--checkpoint=steps:10,x: steps:A,B,... needs step numbers"),
                       ("steps:15", r"no checkpoint for step\(s\) \[15\]"),
                       ("newest", "--checkpoint=newest: unknown checkpoint selection")]:
    with pytest.raises(CheckpointError, match=message):
      checkpoints.parse_selection(bad, steps)
  with pytest.raises(CheckpointError, match="no checkpoints yet"):
    checkpoints.parse_selection("latest", [])


def test_a_save_that_cannot_fit_is_refused_before_writing(tmp_path, monkeypatch):
  ckpt = checkpoints.Checkpointer(tmp_path / "checkpoints", max_to_keep=2)
  state = {"w": jnp.zeros((1000, 1000))}  # 4 MB
  ckpt.save(1, state)
  ckpt.wait()
  usage = shutil.disk_usage(tmp_path)
  monkeypatch.setattr(checkpoints.shutil, "disk_usage",
                      lambda path: usage._replace(free=3 * 2**20))
  with pytest.raises(OSError, match=r"No space left on device \(3\.0 MiB free, the checkpoint "
                                    r"needs about 5\.2 MiB\)") as e:
    ckpt.save(2, state)
  assert e.value.errno == errno.ENOSPC and e.value.filename == str(tmp_path / "checkpoints/2")
  assert ckpt.all_steps() == [1]
  ckpt.close()


def test_averaging_states_averages_their_moving_averages_too():
  _, _, state = tiny_setup(**{"optimizer.ema_decay": 0.9})
  a = state.replace(ema_params=jax.tree_util.tree_map(lambda x: x + 1.0, state.params))
  b = state.replace(ema_params=jax.tree_util.tree_map(lambda x: x + 3.0, state.params))
  mean = checkpoints.average_states([a, b])
  for m, p in zip(jax.tree_util.tree_leaves(mean.ema_params),
                  jax.tree_util.tree_leaves(state.params)):
    np.testing.assert_allclose(np.asarray(m), np.asarray(p) + 2.0, rtol=1e-6)


def test_each_checkpoint_folder_of_a_run_meets_at_cross_host_barriers_of_its_own(tmp_path):
  """Orbax names a save's cross-host barriers by its step: a run's newest and best checkpoints
  (and each population member's) saved at one step on several hosts need prefixes of their
  own, the same wherever the workdir is mounted."""
  run = tmp_path / "run"
  folders = [run / "checkpoints", run / "checkpoints_best", run / "members/0/checkpoints",
             run / "members/0/checkpoints_best", run / "members/1/checkpoints"]
  prefixes = []
  for folder in folders:
    manager = checkpoints.Checkpointer(folder).manager
    prefixes.append(manager._options.multiprocessing_options.barrier_sync_key_prefix)
  assert prefixes == ["checkpoints", "checkpoints_best", "members_0_checkpoints",
                      "members_0_checkpoints_best", "members_1_checkpoints"]
  assert checkpoints.barrier_prefix(Path("/mnt/a/run/members/1/checkpoints")) == \
      checkpoints.barrier_prefix(Path("/data/run/members/1/checkpoints"))
