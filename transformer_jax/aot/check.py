"""A training config checked for a target before anyone rents it: its run's programs compiled
for the target's devices (described by libtpu or the CUDA plugin, not present), each reported
(report.py)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

import jax

from transformer_jax.aot import cuda, programs, report, targets
from transformer_jax.config.sections import TrainConfig
from transformer_jax.errors import UsageError
from transformer_jax.model.attention import attention_implementation
from transformer_jax.parallel import numerics
from transformer_jax.training.settled_config import make_mesh

PROGRAMS = ("train", "eval", "beam")


def levers(cfg: TrainConfig, program: str) -> str:
  """What makes `program` smaller per chip, in the run's own override syntax (only the
  levers not pulled yet)."""
  if program != "train_step":
    return (f"try a smaller --config.decode.batch_size (now {cfg.decode.batch_size}) or "
            "FSDP --config.parallelism.mesh_shape='(1,-1,1)'")
  found = []
  k, rows = cfg.num_micro_batches, cfg.data.batch_size
  more = next((m for m in range(2 * k, rows + 1) if rows % m == 0), None)
  if more is not None:
    found.append(f"--config.num_micro_batches={more} (the batch in {more} pieces)")
  if cfg.model.remat != "full":
    found.append("--config.model.remat=full (recompute activations)")
  if tuple(cfg.parallelism.mesh_shape)[1] == 1:
    found.append("FSDP --config.parallelism.mesh_shape='(1,-1,1)' (parameters and optimizer "
                 "state split over the chips)")
  return "try " + ", or ".join(found) if found else "a bigger slice"


def for_target(cfg: TrainConfig, target: targets.Target | None = None) -> TrainConfig:
  """`cfg` with its "auto" choices (dtype, attention) made as on the target's devices (a TPU
  when not given; this process's own backend would choose for itself: the CPU); on a GPU as
  compiling without one allows (`cuda.for_gpu`)."""
  if target is not None and target.chip.gpu is not None:
    return cuda.for_gpu(cfg, ".".join(map(str, target.chip.gpu.compute_capability)))
  model = cfg.model
  if model.dtype == "auto":
    model = dataclasses.replace(model, dtype=numerics.accelerator_choice("tpu", "").dtype)
  model = dataclasses.replace(model, attention_impl=attention_implementation(model, "tpu"))
  return dataclasses.replace(cfg, model=model)


def selected(which: str) -> tuple[str, ...]:
  names = tuple(n.strip() for n in which.split(",") if n.strip())
  unknown = [n for n in names if n not in PROGRAMS]
  if unknown or not names:
    raise UsageError(f"--programs={which!r}: choose from {', '.join(PROGRAMS)}")
  return names


def check(cfg: TrainConfig, target: targets.Target, which: tuple[str, ...] = PROGRAMS,
          on_report=None, hlo_dir: Path | None = None) -> list[report.Report]:
  """The reports of the programs `which` of a run of `cfg` on `target` (`on_report(r)`: as
  each is done, e.g. to print it; `hlo_dir`: where their optimised HLO is written)."""
  cfg = for_target(cfg, target)
  devices = targets.devices(target)
  mesh = make_mesh(cfg, devices)
  chosen = []
  if "train" in which:
    chosen.append(programs.train_program(cfg, mesh))
  if "eval" in which:
    chosen.append(programs.eval_program(cfg, mesh))
  if "beam" in which:
    chosen.extend(programs.beam_programs(cfg, mesh))
  reports = []
  with without_persistent_cache():
    for program in chosen:
      reports.append(report.compile_program(program, target, len(devices), hlo_dir))
      if on_report is not None:
        on_report(reports[-1])
  return reports


@contextlib.contextmanager
def without_persistent_cache():
  """JAX's persistent cache off: an executable for absent devices cannot be loaded back
  (JAX warns at every lookup), and it would only take space."""
  before = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", before)
