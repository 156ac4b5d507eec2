"""Multi-host start-up: `jax.distributed`, from explicit flags or from what the cluster sets."""

from __future__ import annotations

import os

import jax


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None):
  """Starts jax.distributed for multi-host runs: explicit flags, or JAX's own detection on
  TPU pods and SLURM clusters (`JAX_COORDINATOR_ADDRESS` etc.). A no-op on one process."""
  explicit = coordinator_address is not None
  detected = any(k in os.environ for k in ("SLURM_JOB_ID", "TPU_WORKER_HOSTNAMES",
                                           "JAX_COORDINATOR_ADDRESS"))
  if explicit:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  elif detected and (num_processes or 0) != 1:
    jax.distributed.initialize()
