"""Where the package keeps what outlives a run on this machine: `$XDG_CACHE_HOME/transformer_jax`
(`~/.cache/transformer_jax` when XDG_CACHE_HOME is unset), read when asked, not at import, so
that a process (or the test suite) that sets XDG_CACHE_HOME keeps everything out of the home
directory: the prepared datasets (tfds/), the compiled programs (jax_cache/) and the numerics
probe's figures (numerics.json)."""

import os
from pathlib import Path


def cache_home() -> Path:
  """The package's cache folder (not created here)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return Path(base) / "transformer_jax"
