"""Checkpoint averaging: writes the mean of several checkpoints as a new, usable workdir.

  python -m transformer_jax.average --workdir=runs/default --checkpoint=average:5 \
      --output=runs/default_avg5
  python -m transformer_jax.evaluate --workdir=runs/default_avg5

The output workdir gets the run's config.json and tokenizer and one checkpoint, at the last
averaged step, whose parameters are the element-wise mean (optimizer state: the last one's).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from absl import app, flags

from transformer_jax.metrics import quiet_libraries

from transformer_jax import checkpoints, inference


def average_to_workdir(workdir: str, selection: str, output: str) -> tuple[int, list[int]]:
  """Averages the checkpoints `selection` names into `output`; returns (step, steps)."""
  run = inference.load_run(workdir)
  chosen = run.select(selection)
  if len(chosen) != 1:
    raise checkpoints.CheckpointError(f"--checkpoint={selection} names {len(chosen)} models; "
                                      "averaging takes one selection (average:N or steps:...)")
  _, steps, from_best = chosen[0]
  out = Path(output)
  if out.resolve() == Path(workdir).resolve():
    raise checkpoints.CheckpointError("--output must differ from --workdir (nothing saved "
                                      "there is overwritten)")
  if (out / "checkpoints").exists():
    raise checkpoints.CheckpointError(f"{out}/checkpoints already exists; choose a new --output")
  state = run.state(steps, from_best)
  out.mkdir(parents=True, exist_ok=True)
  shutil.copy(Path(workdir) / "config.json", out / "config.json")
  tok = Path(run.tokenizer.path)
  if tok.parent.resolve() == Path(workdir).resolve():
    shutil.copy(tok, out / tok.name)
  ckpt = checkpoints.Checkpointer(out / "checkpoints", max_to_keep=1)
  ckpt.save(steps[-1], state)
  ckpt.close()
  return steps[-1], steps


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  quiet_libraries()
  FLAGS = flags.FLAGS
  try:
    step, steps = average_to_workdir(FLAGS.workdir, FLAGS.checkpoint, FLAGS.output)
  except (checkpoints.CheckpointError, FileNotFoundError, ValueError) as e:
    sys.exit(f"average: {e}")
  print(f"averaged steps {steps} -> {FLAGS.output}/checkpoints/{step}")


def run():
  flags.DEFINE_string("workdir", None, "A training workdir.")
  flags.DEFINE_string("checkpoint", "average:5", "average:N (the last N) or steps:A,B,...")
  flags.DEFINE_string("output", None, "New workdir for the averaged checkpoint.")
  flags.mark_flags_as_required(["workdir", "output"])
  app.run(main)


if __name__ == "__main__":
  run()
