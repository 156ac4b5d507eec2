"""An imported model written as a workdir that every tool takes as a trained run: config.json
(the default config with the model's options and languages), spm.model (its tokenizer),
tokenizer.json, a checkpoint at step 0, import.json (what came from where) and finetune.py (a
config to fine-tune it). Written in a folder beside the workdir and renamed into place: a kill
leaves no half-made run."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import time
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np

from transformer_jax import atomic
from transformer_jax.config.parse import from_config_dict
from transformer_jax.configs import default
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import CheckpointError, ConfigError
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.training.state import create_state
from transformer_jax.workdir import layout
from transformer_jax.workdir.checkpoints import Checkpointer

RECORD = "import.json"
FINETUNE_CONFIG = "finetune.py"
FINETUNE_LEARNING_RATE = 1e-4  # (the default's 3e-3 is for training from scratch)
FINETUNE_STEPS = 1200


def config_for(options: dict, source_lang: str, target_lang: str):
  """The imported run's config: configs/default.py's training, data and decoding settings
  with the model's options, its languages, no moving average (the weights are used as they
  are) and float32 matmuls."""
  config = default.get_config()
  config.model.update(options)
  config.data.source_lang, config.data.target_lang = source_lang, target_lang
  config.optimizer.ema_decay = 0.0
  config.num_train_steps = FINETUNE_STEPS  # (a length, not a plan: the run is not trained here)
  # (float32: what the model was checked against transformers in; bf16 on request, --dtype)
  config.model.dtype = "float32"
  config.decode.max_length = min(config.decode.max_length, config.model.max_len)
  return config


def finetune_config(options: dict, source_lang: str, target_lang: str, workdir: Path) -> str:
  """The text of a config file that fine-tunes the run imported into `workdir`."""
  model = "".join(f"      {k}={v!r},\n" for k, v in sorted(options.items()))
  return f'''"""Fine-tunes the model imported into {workdir}.

  transformer-jax-train --config={workdir / FINETUNE_CONFIG} \\
      --config.data.data_dir=YOUR_CORPUS --workdir=runs/finetuned

configs/default.py's training settings with the imported model's options (which must stay as
they are: they decide what its weights compute), a fine-tuning learning rate, and the weights
and tokenizer of that run (config.init_from). Written by transformer-jax-import.
"""

from transformer_jax.configs import default


def get_config():
  config = default.get_config()
  config.model.update(dict(
{model}  ))
  config.data.source_lang = {source_lang!r}
  config.data.target_lang = {target_lang!r}
  config.optimizer.learning_rate = {FINETUNE_LEARNING_RATE!r}
  config.num_train_steps = {FINETUNE_STEPS!r}  # (0: as many as fit config.plan.minutes)
  config.init_from.workdir = {str(workdir)!r}
  config.init_from.checkpoint = "latest"  # (the imported weights: step 0)
  return config
'''


def _check_shapes(params, cfg) -> None:
  """Our tree of imported weights has exactly the model's names and shapes (else a bug of
  the mapping, named)."""
  model = Transformer(dataclasses.replace(cfg.model, dtype="float32"))
  dummy = np.ones((1, 8), np.int32)
  expected, ours = (
      {jax.tree_util.keystr(p): x.shape for p, x in jax.tree_util.tree_leaves_with_path(tree)}
      for tree in (nn.meta.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0), dummy,
                                                dummy)["params"]), params))
  for name in sorted(set(expected) | set(ours)):
    if expected.get(name) != ours.get(name):
      raise CheckpointError(f"imported weight {name}: shape {ours.get(name)}, the model's "
                            f"{expected.get(name)}")


def write_run(workdir: str | Path, options: dict, languages: tuple[str, str], params,
              tokenizer_bytes: bytes, record: dict) -> Path:
  """Writes the workdir (which must not exist yet) of a model with config.model `options`
  translating `languages` (source, target); returns its path."""
  workdir = Path(workdir).absolute()
  if workdir.exists() and any(workdir.iterdir()):
    raise ConfigError(f"--workdir={workdir} exists and is not empty: import into a new folder")
  config = config_for(options, *languages)
  cfg = from_config_dict(config)
  _check_shapes(params, cfg)
  tmp = workdir.with_name(f".{workdir.name}.importing")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  layout.save_config(config.to_dict(), tmp)
  (tmp / layout.TOKENIZER).write_bytes(tokenizer_bytes)  # (the folder is renamed in whole)
  layout.record_tokenizer(tmp, Tokenizer.from_bytes(tokenizer_bytes,
                                                    str(workdir / layout.TOKENIZER)))
  init_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="float32"))
  mesh = mesh_lib.make_mesh(cfg.parallelism)
  state, sharding = create_state(init_cfg, Transformer(init_cfg.model), mesh,
                                 jax.random.PRNGKey(0))
  state = state.replace(params=jax.device_put(params, sharding.params))
  ckpt = Checkpointer(tmp / layout.CHECKPOINTS)
  try:
    ckpt.save(0, state)
  finally:
    ckpt.close()  # (waits for the save)
  atomic.write_json(tmp / RECORD, {**record, "imported_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                                   "workdir": str(workdir)}, indent=2)
  (tmp / FINETUNE_CONFIG).write_text(finetune_config(options, *languages, workdir))
  if workdir.exists():
    workdir.rmdir()  # (empty, checked above)
  os.rename(tmp, workdir)
  return workdir


def file_digest(path: Path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()[:16]
