"""Sweeps: spec (search space, objective), study (Optuna storage, trial claims), trials
(training subprocesses, pruning), worker, report."""
