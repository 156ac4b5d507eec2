"""The platform a program is traced for, where the numerics differ by backend (matmul operand
orders, the loss's tiles, attention's implementation): JAX's default backend, or the one a
compile for other devices names (`aot`: a TPU program traced on a CPU machine must take the
TPU's choices, not the CPU's)."""

from __future__ import annotations

import contextlib
import contextvars

import jax

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("target", default=None)


def traced_for() -> str:
  """"cpu", "gpu", "tpu", ...: the target set by `tracing_for`, else JAX's default backend."""
  return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def tracing_for(platform: str):
  """Programs traced inside take `platform`'s choices."""
  token = _TARGET.set(platform)
  try:
    yield
  finally:
    _TARGET.reset(token)
