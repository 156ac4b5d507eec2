"""The process the atomic-claims test starts several of: it claims waiting trials of a study
until none is left. A module of its own that imports the sweep's study code alone (no JAX), so
that each spawned process starts in a fraction of a second."""

import optuna

from transformer_jax.config import search_space as sweep_spec
from transformer_jax.sweeps import study


def claim_all(url, name, queue):
  """Puts the numbers of the trials this process claimed on `queue`."""
  spec = sweep_spec.SweepSpec(search_space={"x": sweep_spec.choice(0)}, fixed={},
                              sampler="random", num_trials=1, direction="minimize")
  storage = study.open_storage(url, 60, 120, 0)
  loaded = optuna.load_study(study_name=name, storage=storage)
  study_id = storage.get_study_id_from_name(name)
  claimed = []
  while (c := study.claim_next_trial(loaded, storage, study_id, spec)) is not None:
    claimed.append(c[0].number)
  queue.put(claimed)
