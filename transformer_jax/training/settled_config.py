"""How a run's config is settled before training: the device mesh checked against the batch,
config.model.dtype="auto" resolved, and what a resumed run must keep as it was trained (its
data order, its weight-decay rule)."""

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


# The keys a resumed run keeps at the values it was trained with (its config.json's; a run
# from before a key existed gets what it then did: layout.ADDED_KEYS), whatever the command
# line or config file says, and why.
RESUMED_AS_TRAINED = {
    ("data", "pretokenize"): "its checkpoints' data position belongs to that order",
    ("data", "num_workers"): "its checkpoints' data position belongs to that order",
    ("optimizer", "weight_decay_exclude"): "its weights were decayed by that rule",
}


def keep_as_trained(cfg: TrainConfig, config_dict: dict | None, workdir: Path
                    ) -> tuple[TrainConfig, dict | None]:
  """`cfg` with the RESUMED_AS_TRAINED keys taken from the workdir's config.json when the run
  resumes, with a warning naming each value that the command line or config file set
  otherwise."""
  if not (workdir / layout.CONFIG).is_file():
    return cfg, config_dict
  recorded = layout.read_config(workdir)
  changed: dict[str, dict] = {}
  for (section, key), why in RESUMED_AS_TRAINED.items():
    value, given = recorded[section][key], getattr(getattr(cfg, section), key)
    if isinstance(given, tuple):  # (JSON holds a list)
      value = tuple(value)
    if value != given:
      log.warning("config.%s.%s=%r differs from the %r this run was trained with (%s): "
                  "resuming with %r, as %s; use another --workdir for a run with the new "
                  "value", section, key, given, value, workdir / layout.CONFIG, value, why)
      changed.setdefault(section, {})[key] = value
  if not changed:
    return cfg, config_dict
  cfg = dataclasses.replace(cfg, **{section: dataclasses.replace(getattr(cfg, section), **keys)
                                    for section, keys in changed.items()})
  if config_dict is not None:
    config_dict = {**config_dict, **{section: {**config_dict[section], **keys}
                                     for section, keys in changed.items()}}
  return cfg, config_dict
