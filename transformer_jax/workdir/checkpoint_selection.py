"""Which weights of a run's workdir a checkpoint selection names (`latest`, `best`, `all`, a
step, `average:N`, `steps:A,B`, each optionally `:ema` / `:raw`) and their restored state:
what the tools' --checkpoint and config.init_from take."""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

from transformer_jax.errors import CheckpointError
from transformer_jax.workdir import layout
from transformer_jax.workdir.checkpoints import Checkpointer, average_states, parse_selection

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Selected:
  """One model a checkpoint selection names: its label, the steps averaged into it, whether
  they live in the best-checkpoint folder, and which weights: "ema" (the moving average),
  "raw" (the trained parameters) or "auto" (the moving average when the run keeps one)."""
  label: str
  steps: list[int]
  from_best: bool = False
  weights: str = "auto"
  # (`latest`: a damaged newest checkpoint gives way to the newest one before it that restores;
  # not compared: it names the same model as its step)
  newest: bool = dataclasses.field(default=False, compare=False)


def checkpoints(workdir: Path, from_best: bool = False, by_bleu: bool = False) -> Checkpointer:
  """A run's checkpoints (read only: nothing is saved through it, so nothing deleted)."""
  folder = layout.BEST_CHECKPOINTS if from_best else layout.CHECKPOINTS
  return Checkpointer(Path(workdir) / folder, best_metric="bleu" if by_bleu else "")


def best_step(workdir: Path) -> int | None:
  if not (Path(workdir) / layout.BEST_CHECKPOINTS).is_dir():
    return None
  ckpt = checkpoints(workdir, from_best=True, by_bleu=True)
  try:
    return ckpt.best_step()
  finally:
    ckpt.close()


def steps(workdir: Path) -> list[int]:
  ckpt = checkpoints(workdir)
  try:
    return ckpt.all_steps()
  finally:
    ckpt.close()


# The labels the tools print for a selection, which name it back.
_LABELS = [(re.compile(r"step_(\d+)"), r"\1"), (re.compile(r"best_step_(\d+)"), r"best@\1"),
           (re.compile(r"average_last_(\d+)_to_(\d+)"), r"average:\1@\2"),
           (re.compile(r"average_(\d+(?:_\d+)*)"), r"steps:\1")]


def _unlabelled(selection: str) -> str:
  """`selection`, or the selection its label names (step_1200_ema -> 1200:ema; best_step_N,
  average_last_N_to_S and average_A_B alike, "@S" holding the step a label was made at)."""
  for suffix in ("_ema", "_raw"):
    if selection.endswith(suffix):
      named = _unlabelled(selection[:-len(suffix)])
      if named != selection[:-len(suffix)]:
        return f"{named}:{suffix[1:]}"
  for pattern, selection_of in _LABELS:
    if pattern.fullmatch(selection):
      return pattern.sub(selection_of, selection).replace("_", ",")
  return selection


def select(workdir: Path, selection: str, has_ema: bool) -> list[Selected]:
  """Each model `selection` names in the run of `workdir` (`has_ema`: whether it keeps a
  moving average, then the default weights, and the label says which); a label the tools
  print names its model again."""
  given, selection = selection, _unlabelled(selection)
  selection, _, made_at = selection.partition("@")
  if ":" in made_at:  # (the weights suffix follows the step: "best@1200:ema")
    made_at, weights_suffix = made_at.split(":")
    selection += f":{weights_suffix}"
  weights = "auto"
  for suffix in ("ema", "raw"):
    if selection.endswith(f":{suffix}"):
      selection, weights = selection[:-len(suffix) - 1], suffix
  if weights == "ema" and not has_ema:
    raise CheckpointError(f"--checkpoint={selection}:ema: {workdir} keeps no moving "
                          "average (trained with config.optimizer.ema_decay=0)")
  averaged = layout.averaged_steps(workdir)
  if averaged and selection == "steps:" + ",".join(map(str, averaged)):
    selection = str(averaged[-1])  # (its checkpoint is that mean)
  if selection == "best":
    best = best_step(workdir)
    if best is None:
      raise CheckpointError(
          f"no best checkpoint in {Path(workdir) / layout.BEST_CHECKPOINTS}: it is kept by "
          "validation BLEU during training")
    chosen = [Selected(f"best_step_{best}", [best], True)]
  else:
    chosen = [Selected(label, steps_, newest=selection == "latest")
              for label, steps_ in parse_selection(selection, steps(workdir))]
  if averaged:  # (a workdir `average` wrote: its checkpoint labelled as the mean it is)
    chosen = [dataclasses.replace(c, label="average_" + "_".join(map(str, averaged)))
              if c.steps == averaged[-1:] and not c.from_best else c for c in chosen]
  if made_at and chosen[0].steps[-1] != int(made_at):
    raise CheckpointError(f"--checkpoint={given}: that model is gone ({selection} is now "
                          f"{chosen[0].label}); name its steps (steps:A,B,...) or a step")
  if has_ema:  # (the label says which weights: results of both can sit side by side)
    suffix = "_raw" if weights == "raw" else "_ema"
    chosen = [dataclasses.replace(c, label=c.label + suffix, weights=weights) for c in chosen]
  return chosen


def restored(workdir: Path, selected: Selected, abstract, weights_only: bool = False):
  """(the selection as read, its train state shaped like `abstract`): one checkpoint's, or
  their parameters' mean. `weights_only`: only the weights `weights` takes are read (the other
  fields are placeholders). A damaged checkpoint (there, but failing to restore) is a
  CheckpointError naming it, except under `latest`: then the newest one before it that
  restores is read, and labelled by its step, with a warning naming each damaged one. Nothing
  is moved: the tools only read a run."""
  fields = (_weights_field(abstract, selected),) if weights_only else None
  ckpt = checkpoints(workdir, selected.from_best)
  try:
    if selected.newest:
      return _newest_restoring(ckpt, selected, abstract, fields)
    states = []
    for step in selected.steps:
      state, damage = ckpt.read(step, abstract, fields=fields)
      if damage:  # (never another checkpoint, or another set averaged, in its place)
        raise CheckpointError(f"checkpoint step {step} in {ckpt.directory} is damaged "
                              f"({damage}); nothing was moved: select another (steps there: "
                              f"{ckpt.all_steps()})")
      states.append(state)
  finally:
    ckpt.close()
  return selected, average_states(states, fields)


def _newest_restoring(ckpt: Checkpointer, selected: Selected, abstract, fields):
  """(Selected, state) of the newest checkpoint up to `latest`'s step that restores."""
  (newest,) = selected.steps
  suffix = selected.label.removeprefix(f"step_{newest}")  # (the weights': "_ema", "_raw")
  damaged = []
  for step in reversed([s for s in ckpt.all_steps() if s <= newest]):
    state, damage = ckpt.read(step, abstract, fields=fields)
    if damage:
      damaged.append((step, damage))
      continue
    if not damaged:
      return selected, state
    log.warning("latest checkpoint: %s; using step %d, the newest that restores (nothing was "
                "moved)", "; ".join(f"step {s} in {ckpt.directory} is damaged ({why})"
                                    for s, why in damaged), step)
    return dataclasses.replace(selected, label=f"step_{step}{suffix}", steps=[step]), state
  raise CheckpointError(f"no checkpoint in {ckpt.directory} can be restored (nothing was "
                        "moved): " + "; ".join(f"step {s} ({why})" for s, why in damaged))


def _weights_field(state, selected: Selected) -> str:
  """The state field holding a selection's weights."""
  has_ema = getattr(state, "ema_params", None) is not None
  return "params" if selected.weights == "raw" or not has_ema else "ema_params"


def weights(state, selected: Selected):
  """The weights of a restored selection: the moving average unless "raw" was asked for (or
  the run keeps none)."""
  return getattr(state, _weights_field(state, selected))
