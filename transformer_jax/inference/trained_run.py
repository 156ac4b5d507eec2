"""A trained run loaded from its workdir: the config it was trained with, its tokenizer, the
model, and the parameters of any checkpoint selection (a step, the best, an average)."""

from __future__ import annotations

import dataclasses
import logging
import typing
from pathlib import Path

from transformer_jax.config.sections import TrainConfig
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import CheckpointError, UsageError
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.parallel import numerics
from transformer_jax.training.state import abstract_state
from transformer_jax.workdir import checkpoint_selection, layout
from transformer_jax.workdir.checkpoint_selection import Selected

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainedRun:
  """A workdir's config, tokenizer and model, with access to its checkpoints."""
  workdir: Path
  cfg: TrainConfig
  tokenizer: Tokenizer
  model: Transformer
  mesh: typing.Any

  def steps(self) -> list[int]:
    return checkpoint_selection.steps(self.workdir)

  def best_step(self) -> int | None:
    return checkpoint_selection.best_step(self.workdir)

  def select(self, checkpoint: str) -> list[Selected]:
    """Each model a selection string names (`workdir.checkpoint_selection.select`)."""
    return checkpoint_selection.select(self.workdir, checkpoint, self.cfg.optimizer.ema_decay > 0)

  def select_one(self, checkpoint: str, tool: str) -> Selected:
    chosen = self.select(checkpoint)
    if len(chosen) != 1:
      raise CheckpointError(f"--checkpoint={checkpoint} names {len(chosen)} models; {tool} "
                            "takes one")
    return chosen[0]

  def state(self, selected: Selected, weights_only: bool = False):
    """The train state of a selection (`restored`'s)."""
    return self.restored(selected, weights_only)[1]

  def restored(self, selected: Selected, weights_only: bool = False):
    """(the selection as read, its train state): one checkpoint's, or their parameters' mean
    (`weights_only`: only the weights `params` takes, the rest placeholders); a damaged
    `latest` read as the newest checkpoint before it that restores
    (`checkpoint_selection.restored`)."""
    return checkpoint_selection.restored(
        self.workdir, selected, abstract_state(self.cfg, self.model, self.mesh), weights_only)

  def source_prefix(self, tag: str) -> list[int]:
    """The ids every source starts with: the id of `--source_tag`'s `tag`, or none."""
    return [self.tokenizer.tag_id(tag, "--source_tag")] if tag else []

  def untagged(self, what: str) -> UsageError:
    """The error for sources (`what`) without the tag that a model of target-language tags
    (`Tokenizer.language_tags`: a multilingual OPUS-MT model, a one-to-many run) needs to
    know which language to translate into."""
    tags = self.tokenizer.language_tags
    shown = ", ".join(tags[:8]) + (f", ... ({len(tags)} tags)" if len(tags) > 8 else "")
    return UsageError(f"{what} has no target-language tag, and {self.workdir} translates into "
                      f"the language the tag names ({shown}): give --source_tag={tags[0]} (or "
                      "start each line with its tag)")

  def params(self, selected: Selected):
    """The weights of a selection (`read_params`')."""
    return self.read_params(selected)[1]

  def read_params(self, selected: Selected):
    """(the selection as read, its weights): the moving average unless "raw" was asked for
    (or the run keeps none); only they are read from the checkpoints."""
    selected, state = self.restored(selected, weights_only=True)
    return selected, checkpoint_selection.weights(state, selected)


def load(workdir: str | Path, dtype: str = "") -> TrainedRun:
  """Reads `<workdir>/config.json` and the run's tokenizer; errors name what is missing.
  `dtype`: the matmul dtype to run the model in ("float32", "bfloat16", "auto"; "" = the
  run's, except that a run trained in bf16 runs in this machine's choice: its bf16 weights
  lose nothing in f32, and a CPU without native bf16 would only emulate it, slower)."""
  workdir = Path(workdir)
  cfg = layout.load_config(workdir)
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


def ensemble_models(runs: list[TrainedRun], selections: list[Selected]):
  """(model, params, the selections as read) to decode with: one run's model and params, or
  tuples of each run's (an ensemble)."""
  models = tuple(run.model for run in runs)
  read = [run.read_params(selected) for run, selected in zip(runs, selections)]
  params = tuple(p for _, p in read)
  used = [s for s, _ in read]
  return (models[0], params[0], used) if len(runs) == 1 else (models, params, used)
