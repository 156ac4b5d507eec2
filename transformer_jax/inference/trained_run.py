"""A trained run loaded from its workdir: the config it was trained with, its tokenizer, the
model, and the parameters of any checkpoint selection (a step, the best, an average)."""

from __future__ import annotations

import dataclasses
import logging
import typing
from pathlib import Path

import ml_collections

from transformer_jax.config.parse import from_config_dict
from transformer_jax.config.sections import TrainConfig
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import CheckpointError
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.parallel import numerics
from transformer_jax.training.state import abstract_state
from transformer_jax.workdir import layout
from transformer_jax.workdir.checkpoints import Checkpointer, average_states, parse_selection

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Selected:
  """One model a checkpoint selection names: its label, the steps averaged into it, and
  whether they live in the best-checkpoint folder."""
  label: str
  steps: list[int]
  from_best: bool = False


@dataclasses.dataclass
class TrainedRun:
  """A workdir's config, tokenizer and model, with access to its checkpoints."""
  workdir: Path
  cfg: TrainConfig
  tokenizer: Tokenizer
  model: Transformer
  mesh: typing.Any

  def _checkpoints(self, from_best: bool = False, by_bleu: bool = False) -> Checkpointer:
    """The run's checkpoints (read only: nothing is saved through it, so nothing deleted)."""
    folder = layout.BEST_CHECKPOINTS if from_best else layout.CHECKPOINTS
    return Checkpointer(self.workdir / folder, best_metric="bleu" if by_bleu else "")

  def steps(self) -> list[int]:
    ckpt = self._checkpoints()
    try:
      return ckpt.all_steps()
    finally:
      ckpt.close()

  def best_step(self) -> int | None:
    if not (self.workdir / layout.BEST_CHECKPOINTS).is_dir():
      return None
    ckpt = self._checkpoints(from_best=True, by_bleu=True)
    try:
      return ckpt.best_step()
    finally:
      ckpt.close()

  def select(self, selection: str) -> list[Selected]:
    """Each model a selection string names (`latest`, `best`, `all`, a step, `average:N`,
    `steps:A,B`)."""
    if selection == "best":
      best = self.best_step()
      if best is None:
        raise CheckpointError(
            f"no best checkpoint in {self.workdir / layout.BEST_CHECKPOINTS}: it is kept by "
            "validation BLEU during training")
      return [Selected(f"best_step_{best}", [best], True)]
    return [Selected(label, steps) for label, steps in parse_selection(selection, self.steps())]

  def select_one(self, selection: str, tool: str) -> Selected:
    chosen = self.select(selection)
    if len(chosen) != 1:
      raise CheckpointError(f"--checkpoint={selection} names {len(chosen)} models; {tool} "
                            "takes one")
    return chosen[0]

  def state(self, selected: Selected):
    """The train state of a selection: one checkpoint's, or their parameters' mean."""
    ckpt = self._checkpoints(selected.from_best)
    abstract = abstract_state(self.cfg, self.model, self.mesh)
    try:
      states = [ckpt.restore(step, abstract) for step in selected.steps]
    finally:
      ckpt.close()
    return average_states(states)

  def params(self, selected: Selected):
    return self.state(selected).params


def load(workdir: str | Path) -> TrainedRun:
  """Reads `<workdir>/config.json` and the run's tokenizer; errors name what is missing."""
  workdir = Path(workdir)
  cfg = from_config_dict(ml_collections.ConfigDict(layout.read_config(workdir)))
  if cfg.model.dtype == "auto":  # (training records the resolved dtype; a hand-made file may not)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(
        cfg.model, dtype=numerics.resolve("auto").dtype))
  tok_path = layout.tokenizer_path(cfg, workdir)
  with layout.naming_recorded_fingerprint(workdir):
    tokenizer = Tokenizer.load(tok_path)
  mismatch = layout.tokenizer_mismatch(workdir, tokenizer)
  if mismatch:
    raise CheckpointError(mismatch)
  if tokenizer.vocab_size > cfg.model.vocab_size:
    raise CheckpointError(
        f"tokenizer {tok_path} has {tokenizer.vocab_size} pieces, more than the model's "
        f"vocab_size {cfg.model.vocab_size}: it does not belong to this checkpoint")
  if not (workdir / layout.CHECKPOINTS).is_dir():
    raise CheckpointError(f"no checkpoints in {workdir / layout.CHECKPOINTS}")
  mesh = mesh_lib.make_mesh(cfg.parallelism)
  return TrainedRun(workdir, cfg, tokenizer, Transformer(cfg.model), mesh)
