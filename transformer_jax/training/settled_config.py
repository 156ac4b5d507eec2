"""How a run's config is settled before training: the device mesh checked against the batch,
config.model.dtype="auto" resolved, and the data order of a resumed run kept."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from transformer_jax.config.sections import TrainConfig
from transformer_jax.errors import ConfigError
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.parallel import numerics
from transformer_jax.workdir import layout

log = logging.getLogger(__name__)


def make_mesh(cfg: TrainConfig, devices=None):
  """The device mesh of `cfg` (over `devices`, default: this process's JAX devices), checked
  against the batch it must split."""
  mesh = mesh_lib.make_mesh(cfg.parallelism, devices)
  dp = mesh_lib.data_parallel_size(mesh)
  if cfg.data.batch_size % (dp * cfg.num_micro_batches):
    raise ConfigError(f"config.data.batch_size={cfg.data.batch_size} is not divisible by the "
                      f"data-parallel size {dp} (mesh {dict(mesh.shape)}) times "
                      f"config.num_micro_batches={cfg.num_micro_batches}")
  return mesh


def resolve_dtype(cfg: TrainConfig, config_dict: dict | None, workdir: Path
                  ) -> tuple[TrainConfig, dict | None]:
  """`cfg` and `config_dict` with config.model.dtype="auto" resolved (parallel.numerics): to
  the dtype recorded in the workdir's config.json when the run resumes, else to what this
  hardware runs fastest. The resolved value is what config.json records."""
  recorded = None
  if cfg.model.dtype == "auto" and (workdir / layout.CONFIG).is_file():
    recorded = layout.read_config(workdir).get("model", {}).get("dtype")
  choice = numerics.resolve(cfg.model.dtype, recorded)
  if cfg.model.dtype == "auto":
    log.info("config.model.dtype=auto resolved to %s: %s", choice.dtype, choice.reason)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=choice.dtype))
    if config_dict is not None:
      config_dict = {**config_dict, "model": {**config_dict["model"], "dtype": choice.dtype}}
  return cfg, config_dict


# What decides the order of the training batches besides the seed: a run resumes with the
# values it was trained with, as its checkpoints hold a position in that order.
DATA_ORDER_KEYS = ("pretokenize", "num_workers")


def keep_data_order(cfg: TrainConfig, config_dict: dict | None, workdir: Path
                    ) -> tuple[TrainConfig, dict | None]:
  """`cfg` with config.data's DATA_ORDER_KEYS taken from the workdir's config.json when the
  run resumes (a run from before a key existed gets what it then did: layout.ADDED_KEYS), with
  a warning naming each value that the command line or config file set otherwise."""
  if not (workdir / layout.CONFIG).is_file():
    return cfg, config_dict
  recorded = layout.read_config(workdir)["data"]
  changed = {k: recorded[k] for k in DATA_ORDER_KEYS if recorded[k] != getattr(cfg.data, k)}
  for key, value in changed.items():
    log.warning("config.data.%s=%r differs from the %r this run was trained with (%s): "
                "resuming with %r, which its checkpoints' data position belongs to; use "
                "another --workdir for a run with the new value", key, getattr(cfg.data, key),
                value, workdir / layout.CONFIG, value)
  if not changed:
    return cfg, config_dict
  cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, **changed))
  if config_dict is not None:
    config_dict = {**config_dict, "data": {**config_dict["data"], **changed}}
  return cfg, config_dict
