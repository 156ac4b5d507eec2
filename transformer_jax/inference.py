"""Loading a trained run (config, tokenizer, model, checkpoints) for evaluation and decoding."""

from __future__ import annotations

import dataclasses
import json
import logging
import typing
from pathlib import Path

import ml_collections

from transformer_jax import checkpoints, sharding, train_lib
from transformer_jax.config import TrainConfig, from_config_dict
from transformer_jax.decode import DecodeConfig
from transformer_jax.model import Transformer
from transformer_jax.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclasses.dataclass
class LoadedRun:
  """A workdir's config, tokenizer and model, with access to its checkpoints."""
  workdir: Path
  cfg: TrainConfig
  tokenizer: Tokenizer
  model: Transformer
  mesh: typing.Any
  checkpoint_dir: Path

  def steps(self) -> list[int]:
    ckpt = checkpoints.Checkpointer(self.checkpoint_dir)
    try:
      return ckpt.all_steps()
    finally:
      ckpt.close()

  def best_step(self) -> int | None:
    best_dir = self.workdir / train_lib.BEST_CHECKPOINTS
    if not best_dir.is_dir():
      return None
    ckpt = checkpoints.Checkpointer(best_dir, 1, best_metric="bleu")
    try:
      return ckpt.best_step()
    finally:
      ckpt.close()

  def params(self, steps: list[int], from_best_dir: bool = False):
    """Parameters of one checkpoint, or the element-wise mean of several."""
    return self.state(steps, from_best_dir).params

  def state(self, steps: list[int], from_best_dir: bool = False):
    directory = self.workdir / train_lib.BEST_CHECKPOINTS if from_best_dir else \
        self.checkpoint_dir
    ckpt = checkpoints.Checkpointer(directory)
    abstract = train_lib.abstract_state(self.cfg, self.model, self.mesh)
    try:
      states = [ckpt.restore(step, abstract) for step in steps]
    finally:
      ckpt.close()
    return checkpoints.average_states(states)

  def select(self, selection: str) -> list[tuple[str, list[int], bool]]:
    """(label, steps, from_best_dir) for each model a selection string names."""
    if selection == "best":
      best = self.best_step()
      if best is None:
        raise checkpoints.CheckpointError(
            f"no best checkpoint in {self.workdir / train_lib.BEST_CHECKPOINTS}: it is kept by "
            "validation BLEU during training")
      return [(f"best_step_{best}", [best], True)]
    return [(label, steps, False)
            for label, steps in checkpoints.parse_selection(selection, self.steps())]


def load_run(workdir: str | Path, checkpoint_dir: str | Path | None = None) -> LoadedRun:
  """Reads `<workdir>/config.json` and the tokenizer; errors name what is missing."""
  workdir = Path(workdir)
  config_path = workdir / "config.json"
  if not config_path.is_file():
    raise checkpoints.CheckpointError(
        f"{workdir} has no config.json: not a transformer_jax workdir (train.py writes it)")
  cfg = from_config_dict(ml_collections.ConfigDict(json.loads(config_path.read_text())))
  tok_path = Path(cfg.data.tokenizer_path) if cfg.data.tokenizer_path else workdir / "spm.model"
  tokenizer = Tokenizer.load(tok_path)
  mismatch = train_lib.tokenizer_mismatch(workdir, tokenizer)
  if mismatch:
    raise checkpoints.CheckpointError(mismatch)
  if tokenizer.vocab_size > cfg.model.vocab_size:
    raise checkpoints.CheckpointError(
        f"tokenizer {tok_path} has {tokenizer.vocab_size} pieces, more than the model's "
        f"vocab_size {cfg.model.vocab_size}: it does not belong to this checkpoint")
  ckpt_dir = Path(checkpoint_dir) if checkpoint_dir else workdir / "checkpoints"
  if not ckpt_dir.is_dir():
    raise checkpoints.CheckpointError(f"no checkpoints in {ckpt_dir}")
  mesh = sharding.make_mesh(cfg.parallelism)
  return LoadedRun(workdir, cfg, tokenizer, Transformer(cfg.model), mesh, ckpt_dir)


def decode_config(base: DecodeConfig, overrides: list[str]) -> DecodeConfig:
  """`base` with `key=value` overrides (from --decode flags), each parsed by its field type."""
  hints = typing.get_type_hints(DecodeConfig)
  changes = {}
  for item in overrides:
    key, sep, value = item.partition("=")
    if not sep or key not in hints:
      raise ValueError(f"--decode {item!r}: expected key=value with key one of "
                       f"{', '.join(hints)}")
    kind = hints[key]
    try:
      if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
          raise ValueError(value)
        changes[key] = value.lower() in ("true", "1")
      else:
        changes[key] = kind(value)
    except ValueError:
      raise ValueError(f"--decode {item!r}: {value!r} is not a valid {kind.__name__}") from None
  return dataclasses.replace(base, **changes)

