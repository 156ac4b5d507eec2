"""A run is built once, whole: every part set up before it exists, none left None to be
filled in later (the loop's behaviour: test_loop.py)."""

import dataclasses

from transformer_jax.training.population_run import Member, PopulationRun
from transformer_jax.training.run import Run, Tally


def test_no_part_of_a_run_a_population_or_a_member_defaults_to_none():
  for cls in (Run, Tally, PopulationRun, Member):
    assert [f.name for f in dataclasses.fields(cls) if f.default is None] == [], cls.__name__
  # (a population's own parts are required too: a Run's fields and three more)
  assert len(dataclasses.fields(PopulationRun)) == len(dataclasses.fields(Run)) + 3
  assert not [f.name for f in dataclasses.fields(Run)
              if f.default is not dataclasses.MISSING
              or f.default_factory is not dataclasses.MISSING]
