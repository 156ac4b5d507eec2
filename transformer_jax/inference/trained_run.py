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
  """One model a checkpoint selection names: its label, the steps averaged into it, whether
  they live in the best-checkpoint folder, and which weights: "ema" (the moving average),
  "raw" (the trained parameters) or "auto" (the moving average when the run keeps one)."""
  label: str
  steps: list[int]
  from_best: bool = False
  weights: str = "auto"


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
    `steps:A,B`), each optionally with `:ema` or `:raw` (which weights of a run that keeps a
    moving average; it is the default there, and the label says which)."""
    weights = "auto"
    for suffix in ("ema", "raw"):
      if selection.endswith(f":{suffix}"):
        selection, weights = selection[:-len(suffix) - 1], suffix
    has_ema = self.cfg.optimizer.ema_decay > 0
    if weights == "ema" and not has_ema:
      raise CheckpointError(f"--checkpoint={selection}:ema: {self.workdir} keeps no moving "
                            "average (trained with config.optimizer.ema_decay=0)")
    chosen = self._select(selection)
    if has_ema:  # (the label says which weights: results of both can sit side by side)
      suffix = "_raw" if weights == "raw" else "_ema"
      chosen = [dataclasses.replace(c, label=c.label + suffix, weights=weights)
                for c in chosen]
    return chosen

  def _select(self, selection: str) -> list[Selected]:
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
    """The weights of a selection: the moving average unless "raw" was asked for (or the run
    keeps none)."""
    state = self.state(selected)
    return state.params if selected.weights == "raw" else state.eval_params


def load(workdir: str | Path, dtype: str = "") -> TrainedRun:
  """Reads `<workdir>/config.json` and the run's tokenizer; errors name what is missing.
  `dtype`: the matmul dtype to run the model in ("float32", "bfloat16", "auto"; "" = the
  run's, except that a run trained in bf16 runs in this machine's choice: its bf16 weights
  lose nothing in f32, and a CPU without native bf16 would only emulate it, slower)."""
  workdir = Path(workdir)
  cfg = from_config_dict(ml_collections.ConfigDict(layout.read_config(workdir)))
  if dtype:
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=dtype))
  # ("auto": training records the resolved dtype, a hand-made file may not)
  if cfg.model.dtype == "auto" or (not dtype and cfg.model.dtype == "bfloat16"):
    choice = numerics.resolve("auto")
    if choice.dtype != cfg.model.dtype:
      log.info("%s runs in %s (this machine's choice: %s)", workdir, choice.dtype,
               choice.reason)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=choice.dtype))
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


def load_ensemble(workdirs: str | Path | list[str | Path], dtype: str = "") -> list[TrainedRun]:
  """One run, or several to decode as one ensemble: each loaded (in `dtype`, see `load`), all
  with one tokenizer (the same fingerprint), else a CheckpointError naming the run whose
  vocabulary differs."""
  if isinstance(workdirs, (str, Path)):
    workdirs = [workdirs]
  runs = [load(w, dtype) for w in workdirs]
  first = runs[0]
  for run in runs[1:]:
    if run.tokenizer.fingerprint != first.tokenizer.fingerprint:
      raise CheckpointError(
          f"--workdir={run.workdir}: its tokenizer {run.tokenizer.path} (fingerprint "
          f"{run.tokenizer.fingerprint}) is not that of --workdir={first.workdir} "
          f"({first.tokenizer.fingerprint}): an ensemble decodes with one vocabulary")
  return runs


def members(runs: list[TrainedRun], selections: list[Selected]):
  """(model, params) to decode with: one run's, or tuples of each run's (an ensemble)."""
  models = tuple(run.model for run in runs)
  params = tuple(run.params(selected) for run, selected in zip(runs, selections))
  return (models[0], params[0]) if len(runs) == 1 else (models, params)
