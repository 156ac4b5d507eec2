"""Checkpoint averaging into a new workdir that evaluate and translate use as they are: the
run's config.json and tokenizer, and one checkpoint, at the last averaged step, whose
parameters (and their moving averages, when the run keeps them) are the element-wise mean
(optimizer state: the last one's), labelled by the tools as that mean (`average_A_B_...`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from transformer_jax.errors import CheckpointError
from transformer_jax.inference import trained_run
from transformer_jax.workdir import layout
from transformer_jax.workdir.checkpoints import Checkpointer


def average_to_workdir(workdir: str, selection: str, output: str) -> tuple[int, list[int]]:
  """Averages the checkpoints `selection` names into `output`; returns (step, steps)."""
  run = trained_run.load(workdir)
  selected = run.select_one(selection, "average (average:N or steps:A,B,...)")
  if selected.weights != "auto":
    raise CheckpointError(f"--checkpoint={selection}: average keeps both the weights and "
                          "their moving average (evaluate and translate choose with :ema / :raw)")
  out = Path(output)
  if out.resolve() == Path(workdir).resolve():
    raise CheckpointError("--output must differ from --workdir (nothing saved there is "
                          "overwritten)")
  if (out / layout.CHECKPOINTS).exists():
    raise CheckpointError(f"{out / layout.CHECKPOINTS} already exists; choose a new --output")
  selected, state = run.restored(selected)
  out.mkdir(parents=True, exist_ok=True)
  for name in (layout.CONFIG, layout.TOKENIZER_RECORD):  # (the record: checked when loaded)
    if (Path(workdir) / name).is_file():
      shutil.copy(Path(workdir) / name, out / name)
  tokenizer_file = Path(run.tokenizer.path)
  if tokenizer_file.parent.resolve() == Path(workdir).resolve():
    shutil.copy(tokenizer_file, out / tokenizer_file.name)
  # (what the tools then label its checkpoint: the mean it is, also when it comes from a
  # workdir `average` wrote; a record an earlier --output left there never stays)
  averaged = layout.averaged_steps(workdir)
  if len(selected.steps) > 1:
    layout.record_average(out, workdir, selected.steps)
  elif averaged and selected.steps == averaged[-1:]:
    shutil.copy(Path(workdir) / layout.AVERAGED, out / layout.AVERAGED)
  else:
    (out / layout.AVERAGED).unlink(missing_ok=True)
  ckpt = Checkpointer(out / layout.CHECKPOINTS, max_to_keep=1)
  ckpt.save(selected.steps[-1], state)
  ckpt.close()
  return selected.steps[-1], selected.steps
