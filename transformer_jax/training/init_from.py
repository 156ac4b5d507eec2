"""Fine-tuning (`config.init_from`): a new run's first state from another run's checkpoint.

Its parameters (the moving average by default, where the run keeps one) replace the freshly
initialised ones once their names and shapes are checked against this config's model; the
optimizer and the step start afresh (fairseq's --reset-optimizer, Marian's
--pretrained-model); the other run's tokenizer is copied into this workdir and its fingerprint
checked. Only a run's start: a resumed run restores its own checkpoints.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp

from transformer_jax import atomic
from transformer_jax.config.model import FUNCTION, options
from transformer_jax.config.sections import TrainConfig
from transformer_jax.data.plan import DataPlan
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import CheckpointError, ConfigError
from transformer_jax.model.transformer import Transformer
from transformer_jax.training.state import abstract_state
from transformer_jax.workdir import checkpoint_selection, layout, preparation
from transformer_jax.workdir.checkpoints import shapes_by_path

log = logging.getLogger(__name__)

RECORD = "init_from.json"  # where the weights came from (in the fine-tuned run's workdir)


def source(cfg: TrainConfig, workdir: Path) -> tuple[Path, TrainConfig]:
  """The run to start from and the config it was trained with."""
  src = Path(cfg.init_from.workdir)
  where = f"config.init_from.workdir={cfg.init_from.workdir}"
  if src.absolute() == Path(workdir).absolute():
    raise ConfigError(f"{where} is this run's own workdir (to go on training it, leave "
                      "config.init_from.workdir empty and rerun)")
  if not (src / layout.CONFIG).is_file():
    raise ConfigError(f"{where}: no {layout.CONFIG} there (not a transformer_jax run)")
  return src, layout.load_config(src)


def load_tokenizer(cfg: TrainConfig, workdir: Path, data: DataPlan) -> Tokenizer:
  """The fine-tuned run's tokenizer: the source run's, copied into this workdir unless
  config.data.tokenizer_path names one or the workdir has one; then loaded as any run's
  (`workdir.preparation.load_tokenizer`) and a ConfigError unless its fingerprint is the
  source's."""
  src, src_cfg = source(cfg, workdir)
  theirs = layout.tokenizer_path(src_cfg, src)
  if not theirs.is_file():
    raise ConfigError(f"config.init_from.workdir={src}: its tokenizer {theirs} is missing")
  ours = layout.tokenizer_path(cfg, workdir)
  if not cfg.data.tokenizer_path and not ours.exists() and jax.process_index() == 0:
    with atomic.replacing(ours) as tmp:
      shutil.copyfile(theirs, tmp)
    log.info("Tokenizer of %s copied to %s", src, ours)
  tokenizer = preparation.load_tokenizer(cfg, workdir, data)
  source_tokenizer = Tokenizer.load(theirs)
  if tokenizer.fingerprint != source_tokenizer.fingerprint:
    raise ConfigError(
        f"config.init_from.workdir={src}: its tokenizer {source_tokenizer.path} (fingerprint "
        f"{source_tokenizer.fingerprint}) is not this run's {tokenizer.path} "
        f"({tokenizer.fingerprint}); a fine-tuned run keeps the vocabulary of the run it starts "
        "from (leave config.data.tokenizer_path empty to take it)")
  return tokenizer


def initial_state(cfg: TrainConfig, workdir: Path, model: Transformer, mesh, state):
  """`state`, freshly initialised, with the source run's selected weights as its parameters
  (and as the start of its moving average, if it keeps one); step and optimizer untouched."""
  src, src_cfg = source(cfg, workdir)
  for name in options(FUNCTION):  # (the same shapes, another function)
    ours, theirs = getattr(cfg.model, name), getattr(src_cfg.model, name)
    if ours != theirs:
      raise ConfigError(f"config.model.{name}={ours!r}, but {src} was trained with {theirs!r}: "
                        "its weights would compute another function; use its value")
  # (laid out as ours, in our dtype: the source's may be "auto", as an imported run's is)
  src_cfg = dataclasses.replace(src_cfg, parallelism=cfg.parallelism,
                                model=dataclasses.replace(src_cfg.model, dtype=cfg.model.dtype))
  chosen = checkpoint_selection.select(src, cfg.init_from.checkpoint,
                                       src_cfg.optimizer.ema_decay > 0)
  if len(chosen) != 1:
    raise CheckpointError(f"config.init_from.checkpoint={cfg.init_from.checkpoint} names "
                          f"{len(chosen)} models of {src}; fine-tuning starts from one")
  (selected,) = chosen
  abstract = abstract_state(src_cfg, Transformer(src_cfg.model), mesh)
  _check_shapes(shapes_by_path(abstract.params), shapes_by_path(state.params), src, selected)
  # (as read: a damaged `latest` gives way to the newest checkpoint that restores)
  selected, restored = checkpoint_selection.restored(src, selected, abstract, weights_only=True)
  params = checkpoint_selection.weights(restored, selected)
  params = jax.tree_util.tree_map(lambda new, old: new.astype(old.dtype), params, state.params)
  state = state.replace(params=params)
  if getattr(state, "ema_params", None) is not None:  # (buffers of their own: both donated)
    state = state.replace(ema_params=jax.tree_util.tree_map(jnp.copy, params))
  record = {"workdir": str(src.absolute()), "checkpoint": cfg.init_from.checkpoint,
            "selected": selected.label, "steps": selected.steps,
            "weights": "raw" if selected.weights == "raw" or not src_cfg.optimizer.ema_decay
            else "ema"}
  if jax.process_index() == 0:
    atomic.write_json(Path(workdir) / RECORD, record, indent=2)
  log.info("Initialised from %s (%s, %s weights): optimizer and step start afresh", src,
           selected.label, record["weights"])
  return state


def _check_shapes(theirs: dict, ours: dict, src: Path, selected):
  """A ConfigError naming the first parameter that the two models do not share."""
  for path in sorted(set(theirs) | set(ours)):
    name = "/".join(path)
    if path not in ours:
      problem = f"parameter {name} of {src} has no place in this config's model"
    elif path not in theirs:
      problem = f"this config's parameter {name} is not in {src}"
    elif theirs[path] != ours[path]:
      problem = (f"parameter {name} is {theirs[path]} in {src} but {ours[path]} in this "
                 "config's model")
    else:
      continue
    raise ConfigError(f"config.init_from ({selected.label}): {problem}; the model options that "
                      "set shapes (sizes, layers, vocab_size, norm, ...) must be the source "
                      "run's")
