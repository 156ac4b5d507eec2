"""Fault injection specs (TRANSFORMER_JAX_FAULTS) are parsed or named as wrong."""

import pytest

from transformer_jax.training import preemption as faults


def test_fault_spec_errors_are_named(monkeypatch):
  monkeypatch.setenv(faults.ENV, "sigkill@7,explode@3")
  with pytest.raises(ValueError, match="'explode@3' is not one of"):
    faults.Faults.from_env()
  monkeypatch.setenv(faults.ENV, "sigterm@5, nonfinite@2")
  assert faults.Faults.from_env() == faults.Faults(sigterm_at=5, nonfinite_at=2)
