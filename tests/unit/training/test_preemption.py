"""Fault injection specs (TRANSFORMER_JAX_FAULTS) are parsed or named as wrong."""

import pytest

from transformer_jax.training import preemption as faults


def test_fault_spec_errors_are_named(monkeypatch):
  monkeypatch.setenv(faults.ENV, "sigkill@7,explode@3")
  with pytest.raises(ValueError, match="'explode@3' is not one of"):
    faults.Faults.from_env()
  monkeypatch.setenv(faults.ENV, "sigterm@5, nonfinite@2")
  assert faults.Faults.from_env() == faults.Faults(sigterm_at=5, nonfinite_at=2)


def test_a_slow_validation_waits_before_each_batch_of_its_step_only(monkeypatch):
  monkeypatch.setenv(faults.ENV, "slow_validation@4")
  injected = faults.Faults.from_env()
  waits = []
  monkeypatch.setattr(faults.time, "sleep", waits.append)
  injected.before_validation_batch(2)
  injected.before_validation_batch(4)
  assert waits == [faults.SLOW_BATCH_S]
