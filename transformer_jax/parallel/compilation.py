"""The persistent compilation cache: a process that compiles a program another process already
compiled on this machine (a resumed run, each sweep trial, evaluate after train) loads it.

JAX's own settings win (`JAX_COMPILATION_CACHE_DIR`, or `jax_compilation_cache_dir` set in
code); otherwise the cache lives in `jax_cache/<machine>` under the package's cache folder
(`config.folders.cache_home`: `$XDG_CACHE_HOME/transformer_jax` or `~/.cache/transformer_jax`),
one folder per CPU model, ISA flags, jax version and XLA_FLAGS, so that a home directory
shared by machines of different kinds never hands one of them code compiled for another.
`TRANSFORMER_JAX_COMPILATION_CACHE=0` turns it off. Programs that took at least
MIN_COMPILE_SECONDS to compile are kept (JAX's default is 1 s: the decoder's search loops for a
few rows compile faster than that, and a line translated interactively would wait for them
in every new process). The decoding programs also go to the program store
(`program_store`: `programs/<machine>` under the package's cache folder, on with the cache and
off with the switch), which loads them without tracing them.

`program_seconds` counts the time this process spent preparing programs (tracing, lowering,
compiling or loading them from a cache), from JAX's own duration events and the store's, so
that a speed can be given apart from it; a program prepared on a thread beside the work
(`in_background`) counts only as long as the work waited for it (`waited`).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path

import jax
from jax import monitoring

from transformer_jax.config.folders import cache_home
from transformer_jax.parallel import numerics, program_store
from transformer_jax.parallel.hardware import cpu_info

log = logging.getLogger(__name__)

SWITCH = "TRANSFORMER_JAX_COMPILATION_CACHE"
MIN_COMPILE_SECONDS = 0.1


def cache_dir(environ: Mapping[str, str], configured: str | None,
              root: Path | None = None) -> Path | None:
  """Where the cache should be (under `root`, by default the package's cache folder's
  jax_cache/), or None when JAX's own setting or the switch decides."""
  if environ.get(SWITCH, "1") == "0" or environ.get("JAX_COMPILATION_CACHE_DIR") or configured:
    return None
  return _machine_folder(root or cache_home() / "jax_cache")


def program_store_dir(environ: Mapping[str, str], root: Path | None = None) -> Path | None:
  """Where `program_store` keeps this machine's programs (under `root`, by default the
  package's cache folder's programs/), or None when the switch is off."""
  if environ.get(SWITCH, "1") == "0":
    return None
  return _machine_folder(root or cache_home() / "programs")


def _machine_folder(root: Path) -> Path:
  """This machine kind's folder under `root` (CPU model, ISA flags, jax version, XLA_FLAGS)."""
  return root / numerics.machine_key(*cpu_info())


def enable_compilation_cache():
  """Points JAX's persistent compilation cache at this machine's folder, and the program store
  at its own (see the module doc)."""
  store = program_store_dir(os.environ)
  if store is not None:
    program_store.enable(store)
  folder = cache_dir(os.environ, jax.config.jax_compilation_cache_dir)
  if folder is None:
    return
  try:
    folder.mkdir(parents=True, exist_ok=True)
  except OSError as e:  # e.g. a read-only home: compile as before
    log.warning("no persistent compilation cache (%s: %s)", folder, e)
    return
  jax.config.update("jax_compilation_cache_dir", str(folder))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)


# JAX's duration events of preparing a program: tracing, lowering, and compiling it (or, with
# the persistent cache, loading it).
PROGRAM_EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration", program_store.LOAD_EVENT)
# (a program compiled, or loaded whole from the program store: one made ready to run)
PROGRAM_READY_EVENTS = ("/jax/core/compile/backend_compile_duration", program_store.LOAD_EVENT)
_prepared = {"seconds": 0.0, "programs": 0, "listening": False}


_thread = threading.local()  # (`in_background`: this thread prepares beside the work)


def _count(event: str, duration: float, **_):
  if event in PROGRAM_EVENTS and not getattr(_thread, "in_background", False):
    _prepared["seconds"] += duration
  if event in PROGRAM_READY_EVENTS:
    _prepared["programs"] += 1


def in_background():
  """Marks this thread as preparing programs beside the work that will run them: its
  seconds are not the work's (`waited` counts what the work waits for them)."""
  _thread.in_background = True


def waited(seconds: float):
  """Counts `seconds` the work spent waiting for a program prepared in the background."""
  _listen()
  _prepared["seconds"] += seconds


def _listen():
  if not _prepared["listening"]:
    monitoring.register_event_duration_secs_listener(_count)
    _prepared["listening"] = True


def program_seconds() -> float:
  """Seconds this process has spent preparing programs since the first call (the difference
  of two calls: the share of the time between them)."""
  _listen()
  return _prepared["seconds"]


def programs_prepared() -> int:
  """Programs this process has compiled, or loaded from the program store, since the first
  call (the difference of two calls: those prepared between them, e.g. after a server's
  warm-up)."""
  _listen()
  return _prepared["programs"]
