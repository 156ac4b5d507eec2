"""Where log lines go: ours ("HH:MM:SS message", INFO) on stderr; the libraries' (Orbax and TFDS
log through absl) from WARNING up, unless a higher verbosity is asked for."""

from __future__ import annotations

import logging
import sys

from absl import logging as absl_logging


class _Stderr(logging.StreamHandler):
  """A handler that writes to whatever sys.stderr is when a line is logged (a captured or
  redirected stderr included), not to the stream of its creation."""

  @property
  def stream(self):
    return sys.stderr

  @stream.setter
  def stream(self, value):
    del value


def setup(verbosity: int = 0):
  """Our lines at INFO on stderr (set up once per process, however often called); library
  logs from WARNING up (verbosity 0), INFO (1) or DEBUG (2 and more)."""
  ours = logging.getLogger("transformer_jax")
  if not any(isinstance(h, _Stderr) for h in ours.handlers):
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
    ours.addHandler(handler)
  ours.setLevel(logging.INFO)
  ours.propagate = False
  if verbosity > 0:
    absl_logging.use_absl_handler()
  absl_logging.set_verbosity({0: absl_logging.WARNING, 1: absl_logging.INFO}.get(
      max(verbosity, 0), absl_logging.DEBUG))
