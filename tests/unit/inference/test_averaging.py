"""Checkpoint averaging: the element-wise mean, written as a workdir evaluate can use."""

import shutil

import jax
import numpy as np
import pytest

from tests import helpers
from transformer_jax.cli import average as average_cli
from transformer_jax.inference import trained_run
from transformer_jax.inference.averaging import average_to_workdir
from transformer_jax.inference.checkpoint_eval import evaluate_checkpoints
from transformer_jax.inference.trained_run import Selected
from transformer_jax.workdir import checkpoint_selection, checkpoints


def test_averaging_identical_and_different_checkpoints(tiny_run, tmp_path):
  run = trained_run.load(tiny_run)
  s10, s20 = run.state(Selected("a", [10])), run.state(Selected("b", [20]))
  same = checkpoints.average_states([s20, s20, s20])
  for a, b in zip(jax.tree_util.tree_leaves(same.params), jax.tree_util.tree_leaves(s20.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
  mean = run.params(Selected("mean", [10, 20]))
  for m, a, b in zip(*(jax.tree_util.tree_leaves(x) for x in (mean, s10.params, s20.params))):
    np.testing.assert_allclose(np.asarray(m), (np.asarray(a) + np.asarray(b)) / 2, rtol=1e-6)
  # The averaged checkpoint is a workdir that evaluate can use.
  step, steps = average_to_workdir(str(tiny_run), "average:2", str(tmp_path / "avg"))
  assert (step, steps) == (20, [10, 20])
  for name in ("config.json", "spm.model", "tokenizer.json"):
    assert (tmp_path / "avg" / name).read_bytes() == (tiny_run / name).read_bytes()
  res, _ = evaluate_checkpoints(tmp_path / "avg", split="val", max_sentences=8)
  # (labelled as the mean it is, a label that names it back)
  assert res[0]["steps"] == [20] and res[0]["label"] == "average_10_20"
  assert checkpoint_selection.select(tmp_path / "avg", "average_10_20", False) == \
      checkpoint_selection.select(tmp_path / "avg", "latest", False)
  # The average's own checkpoint copied on is still that mean; a single step written where an
  # earlier average left its record is that step.
  average_to_workdir(str(tmp_path / "avg"), "latest", str(tmp_path / "again"))
  assert [c.label for c in checkpoint_selection.select(tmp_path / "again", "latest", False)] \
      == ["average_10_20"]
  shutil.rmtree(tmp_path / "avg" / "checkpoints")
  average_to_workdir(str(tiny_run), "20", str(tmp_path / "avg"))
  assert [c.label for c in checkpoint_selection.select(tmp_path / "avg", "latest", False)] == [
      "step_20"]


def test_the_average_tool_refuses_to_overwrite(tiny_run, tmp_path):
  status, out, _ = helpers.run_tool(average_cli.main, f"--workdir={tiny_run}",
                                    "--checkpoint=steps:10,20", f"--output={tmp_path / 'avg'}")
  assert status == 0 and "averaged steps [10, 20]" in out
  status, _, err = helpers.run_tool(average_cli.main, f"--workdir={tiny_run}",
                                    f"--output={tmp_path / 'avg'}", "--checkpoint=average:2")
  assert status == 1 and "already exists; choose a new --output" in err
  with pytest.raises(Exception, match="--output must differ from --workdir"):
    average_to_workdir(str(tiny_run), "average:2", str(tiny_run))
