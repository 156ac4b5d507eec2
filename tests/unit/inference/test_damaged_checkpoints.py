"""A damaged checkpoint under the tools that read one (evaluate, translate, average): `latest`
falls back to the newest that restores, saying so in one line and labelled by the step used;
a checkpoint named otherwise stops in one line naming it; nothing is moved."""

import gc
import json
import os

import pytest

from tests import helpers
from transformer_jax import errors
from transformer_jax.cli import average as average_cli
from transformer_jax.cli import evaluate as evaluate_cli
from transformer_jax.cli import translate as translate_cli
from transformer_jax.inference import trained_run
from transformer_jax.workdir import checkpoints


def _damage(checkpoint, truncated: bool = False):
  """As a disk or a copy that lost a file: the state's metadata gone, or its data files cut to
  half their size."""
  if not truncated:
    (checkpoint / "state" / "_METADATA").unlink()
  for data in (checkpoint / "state").rglob("d/*") if truncated else ():
    os.truncate(data, data.stat().st_size // 2)


def _folders(run):
  return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_dir())


def _translate(workdir, *args):
  """translate on no input: the model is loaded, nothing decoded."""
  return helpers.run_tool(translate_cli.main, f"--workdir={workdir}", "--interactive=false",
                          *args, stdin=b"")


# (Orbax's reads abandoned when one fails each report to sys.unraisablehook: none may get through)
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_latest_falls_back_in_one_line_and_a_named_damaged_checkpoint_stops_naming_it(
    tiny_run, tmp_path, caplog):
  run = helpers.copy_run(tiny_run, tmp_path / "run")
  best = helpers.checkpoint_steps(run, "checkpoints_best")[0]
  _damage(run / "checkpoints" / "20", truncated=True)
  folders = _folders(run)
  damaged = f"step 20 in {run.absolute() / 'checkpoints'} is damaged ("

  status, _, err = _translate(run)
  assert status == 0, err[-2000:]
  warnings = [line for line in err.splitlines() if "damaged" in line]
  assert len(warnings) == 1 and f"latest checkpoint: {damaged}" in warnings[0]
  assert warnings[0].endswith("using step 10, the newest that restores (nothing was moved)")

  # Named: a step, every checkpoint, an average: one line naming it, nothing else in its place.
  line = f"checkpoint {damaged}"
  status, _, err = _translate(run, "--checkpoint=20")
  assert status == 1 and helpers.one_line_error(err).startswith(f"translate: {line}")
  assert helpers.one_line_error(err).endswith("nothing was moved: select another (steps there: "
                                              "[10, 20])")
  # (`latest` scored as step 10, labelled so; then `all`: step 10 again, replacing that result,
  # and step 20 an error; the results before it are kept)
  status, _, err = helpers.run_tool(evaluate_cli.main, f"--workdir={run}", "--checkpoint=latest",
                                    "--checkpoint=all", "--max_sentences=2",
                                    f"--output_dir={tmp_path / 'eval'}")
  assert status == 1 and helpers.one_line_error(err).startswith(f"evaluate: {line}")
  (result,) = json.loads((tmp_path / "eval" / "results.json").read_text())
  assert (result["label"], result["steps"]) == ("step_10", [10])
  status, _, err = helpers.run_tool(average_cli.main, f"--workdir={run}", "--checkpoint=average:2",
                                    f"--output={tmp_path / 'avg'}")
  assert status == 1 and helpers.one_line_error(err).startswith(f"average: {line}")
  assert not (tmp_path / "avg" / "checkpoints").exists()
  _damage(run / "checkpoints_best" / str(best))
  status, _, err = helpers.run_tool(evaluate_cli.main, f"--workdir={run}", "--checkpoint=best",
                                    f"--output_dir={tmp_path / 'best'}")
  assert status == 1 and helpers.one_line_error(err).startswith(
      f"evaluate: checkpoint step {best} in {run.absolute() / 'checkpoints_best'} is damaged (")

  # None that restores: one line naming each.
  _damage(run / "checkpoints" / "10")
  status, _, err = _translate(run)
  assert status == 1 and helpers.one_line_error(err).startswith(
      f"translate: no checkpoint in {run.absolute() / 'checkpoints'} can be restored (nothing "
      "was moved): step 20 (")
  assert "; step 10 (" in helpers.one_line_error(err)
  assert _folders(run) == folders and not os.path.exists(run / "checkpoints_damaged")
  gc.collect()  # (nor does asyncio log the reads it abandoned, as their tasks go)
  assert [r.getMessage()[:80] for r in caplog.records if r.name == "asyncio"] == []


def test_a_stop_asked_for_while_latest_is_read_is_no_damage(tiny_run, monkeypatch):
  """SIGTERM under translate-corpus raises Interrupted in the middle of a restore: it stops the
  tool, where taking it for damage fell back to an older checkpoint and went on to exit 0."""
  def interrupted(self, step, abstract, data_iterator=None, fields=None):
    raise errors.Interrupted("stopped by SIGTERM")

  monkeypatch.setattr(checkpoints.Checkpointer, "restore", interrupted)
  run = trained_run.load(tiny_run)
  with pytest.raises(errors.Interrupted):
    run.restored(run.select_one("latest", "translate"))
