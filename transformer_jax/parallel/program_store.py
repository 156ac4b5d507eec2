"""Compiled programs kept between processes and loaded without tracing: what makes a decoding
tool's first sentence come in its first seconds.

JAX's persistent cache is keyed by the lowered program, so even a hit costs tracing the Python
function and lowering it (several times what loading a stored program takes: BENCHMARKS.md,
"A decoding tool's first seconds"), in every process and for every shape a search meets.
`stored_jit` keys a program by what determines it before any tracing: this package's source
(`source_digest`, read when the store is enabled), the versions of Python, jax, jaxlib, flax,
numpy and ml_dtypes, the devices and their runtime, JAX's tracing settings, the function (its
name and code; closures are refused), its static arguments, and the pytree, shapes, dtypes,
weak types and shardings of the others. A program found under its key is deserialized and
called (`jax.experimental.serialize_executable`); one not found is compiled as `jax.jit`
would and stored. A process keeps the programs it has met in memory.

Only programs this process compiled itself are stored: one that JAX's persistent cache handed
over cannot be serialized whole again (XLA:CPU; the copy fails to run), so each program is
compiled under a name holding its key (`jit_<function>_<key>`), which JAX's cache has seen only
if this store lost the file; then it is compiled once more under a fresh name. (JAX's cache
keeps its own copy of each, read only in that case.) A stored program that fails to load or to
run its first call is deleted and compiled again, with a warning; one that cannot be
serialized (a host callback) is not stored.

The store is on once `enable` has been called (by `compilation.enable_compilation_cache`: in
every tool and in training, unless TRANSFORMER_JAX_COMPILATION_CACHE=0), in
`programs/<machine>/` under the package's cache folder, at most MAX_BYTES (the programs used
least recently go first); off, a StoredJit is `jax.jit`. A multi-process run does not use it
(its programs span processes). Like JAX's cache, a stored file is trusted code: the folder is
the user's own.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import inspect
import logging
import marshal
import os
import pickle
import secrets
import sys
import threading
import time
from pathlib import Path

import jax
from jax import monitoring
from jax.experimental import serialize_executable

from transformer_jax import atomic

log = logging.getLogger(__name__)

LOAD_EVENT = "/transformer_jax/program_store/load_duration"  # (counted as preparing programs)
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
# (a program of one signature found or compiled once: threads meeting it wait for the first;
# programs of other signatures compile at the same time, each thread counting the persistent
# cache's hits of its own compiles)
_LOCKS = threading.Lock()
_first_calls: dict = {}
_hits = threading.local()


def _first_call_lock(signature) -> threading.Lock:
  with _LOCKS:
    return _first_calls.setdefault(signature, threading.Lock())


MAX_BYTES = 1 << 30  # the store's size, beyond which the programs used least recently go
# (JAX settings that change what a function traces to, or where it runs)
_TRACING_SETTINGS = ("jax_enable_x64", "jax_explicit_x64_dtypes", "jax_default_matmul_precision",
                     "jax_numpy_rank_promotion", "jax_numpy_dtype_promotion",
                     "jax_default_prng_impl", "jax_threefry_partitionable", "jax_default_device")
_store = {"folder": None, "source": "", "environment": "", "listening": False}


def enable(folder: str | Path):
  """Stores programs in `folder` (and loads them from it) from now on in this process. The
  package's source is read now, when a tool starts, its modules imported: a file edited
  while a long run goes on does not key the programs that run traced from the code it
  imported."""
  if not _store["listening"]:
    monitoring.register_event_listener(_count_cache_hit)
    _store["listening"] = True
  # (the devices join at the first program: a multi-host run starts JAX's backend only after
  # jax.distributed.initialize)
  _store["source"], _store["environment"] = _source(), ""
  _store["folder"] = Path(folder)


def folder() -> Path | None:
  """Where programs are stored, or None (not enabled, or a multi-process run)."""
  return _store["folder"] if jax.process_count() == 1 else None


def _count_cache_hit(event: str, **_):
  if event == _CACHE_HIT_EVENT:  # (recorded by the thread that compiles)
    _hits.count = getattr(_hits, "count", 0) + 1


def source_digest() -> str:
  """A digest of the package's source files as this process first read them (at `enable`, or
  at the first call): what keys the programs, and the CTranslate2 exports, that a version of
  the code makes."""
  if not _store["source"]:
    _store["source"] = _source()
  return _store["source"]


def _source() -> str:
  """A digest of the package's source files, read now."""
  digest = hashlib.sha256()
  package = Path(__file__).resolve().parents[1]
  for path in sorted(package.rglob("*.py")):
    digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
  return digest.hexdigest()


def _environment() -> str:
  """What every key of this process starts with: the package's source (as read by `enable`),
  the versions of Python and of what traces and compiles it, the devices and their
  runtime."""
  versions = [sys.version] + [f"{name}={importlib.metadata.version(name)}"
                              for name in ("jax", "jaxlib", "flax", "numpy", "ml_dtypes")]
  devices = jax.devices()
  text = repr((_store["source"], versions,
               [f"{d.platform}:{d.device_kind}:{d.id}" for d in devices],
               devices[0].client.platform_version,
               os.environ.get("XLA_FLAGS", ""), os.environ.get("LIBTPU_INIT_ARGS", "")))
  return hashlib.sha256(text.encode()).hexdigest()


def _settings() -> tuple:
  return tuple(getattr(jax.config, name) for name in _TRACING_SETTINGS)


def _leaf(x) -> tuple:
  """What a program depends on of an argument: its shape, dtype, weak type and placement."""
  if not hasattr(x, "shape"):  # (a Python number: weakly typed, placed by the program)
    aval = jax.typeof(x)
    return aval.shape, aval.dtype, aval.weak_type, None
  return x.shape, x.dtype, getattr(x, "weak_type", False), getattr(x, "sharding", None)


def _sharding_text(sharding) -> str:
  if sharding is None:  # (numpy and Python values: placed on the default device)
    return "host"
  mesh = getattr(sharding, "mesh", None)
  if mesh is not None and hasattr(mesh, "devices"):  # (a NamedSharding: its devices in order)
    return f"{sharding.spec}|{mesh.axis_names}|{getattr(mesh, 'axis_types', '')}|" \
           f"{[d.id for d in mesh.devices.flat]}|{mesh.devices.shape}|{sharding.memory_kind}"
  return repr(sharding)


class StoredJit:
  """A `jax.jit` of `fun` whose compiled programs are stored (see the module doc). Static
  arguments are keyword-only; the others are given positionally. `fun` is a module-level
  function: a closure's values would not be in the key."""

  def __init__(self, fun, static_argnames: tuple[str, ...] = (),
               donate_argnames: tuple[str, ...] = ()):
    if fun.__closure__ or "<locals>" in fun.__qualname__:
      raise TypeError(f"{fun.__qualname__}: a StoredJit takes a module-level function (what a "
                      "closure holds is not in a program's key)")
    parameters = inspect.signature(fun).parameters
    for name in static_argnames:
      if name not in parameters or parameters[name].kind is not inspect.Parameter.KEYWORD_ONLY:
        raise TypeError(f"{fun.__qualname__}: static argument {name!r} must be keyword-only")
    functools.update_wrapper(self, fun)
    self._fun, self._static, self._donate = fun, tuple(static_argnames), tuple(donate_argnames)
    # (the function's own code in the key too: the package's source does not hold a function
    # outside it)
    self._code = hashlib.sha256(marshal.dumps(fun.__code__)).hexdigest()
    self._jitted = jax.jit(fun, static_argnames=static_argnames, donate_argnames=donate_argnames)
    self._programs = {}  # signature -> compiled program (this process)
    self._preloaded = {}  # signature -> loaded program, not yet run

  def __call__(self, *args, **kwargs):
    where = folder()
    if where is None or jax.config.jax_disable_jit:
      return self._jitted(*args, **kwargs)
    signature, static = self._signature(args, kwargs)
    program = self._programs.get(signature)
    if program is not None:
      return program(*args)
    with _first_call_lock(signature):  # (threads meeting one new shape: one compiles it;
      program = self._programs.get(signature)  # other shapes compile meanwhile)
      if program is not None:
        return program(*args)
      return self._first_call(where, signature, static, args)

  def _first_call(self, where: Path, signature, static, args):
    """Loads (or compiles and stores in `where`) the program of `signature` and runs it on
    `args`."""
    key = self._key(signature)
    path = self._path(where, key)
    program = self._preloaded.pop(signature, None) or _load(path)
    if program is not None:
      try:
        out = program(*args)
      except jax.errors.JaxRuntimeError as e:  # (e.g. a file not written by this store)
        log.warning("stored program %s does not run (%s); compiling it again", path,
                    str(e).splitlines()[0])
        path.unlink(missing_ok=True)
      else:
        self._programs[signature] = program
        return out
    program = self._programs[signature] = self._compile(path, key, args, static)
    return program(*args)

  def preload(self, *args, **kwargs):
    """Loads, without running it, the stored program that these arguments (arrays, or
    jax.ShapeDtypeStructs like them) would run: e.g. a search's next program, read while
    the current one computes. Returns its outputs' ShapeDtypeStructs, or None (no store, or
    no such program stored)."""
    where = folder()
    if where is None:
      return None
    signature, _ = self._signature(args, kwargs)
    program = self._programs.get(signature) or self._preloaded.get(signature)
    if program is None:
      program = _load(self._path(where, self._key(signature)))
      if program is None:
        return None
      self._preloaded[signature] = program
    return program.out_info

  @property
  def function(self):
    """The function it compiles (e.g. for jax.export to another platform)."""
    return self._fun

  def lower(self, *args, **kwargs) -> jax.stages.Lowered:
    """The program for these arguments (jax.ShapeDtypeStructs welcome) lowered, neither
    stored nor loaded: to compile it for devices this process does not run on."""
    return self._jitted.lower(*args, **kwargs)

  def _signature(self, args, kwargs) -> tuple[tuple, dict]:
    """(What a program depends on of a call, in a form quick to hash; its static arguments.)"""
    kwargs = dict(kwargs)
    static = tuple((name, kwargs.pop(name)) for name in self._static if name in kwargs)
    if kwargs:
      raise TypeError(f"{self._fun.__qualname__}: give {sorted(kwargs)} positionally")
    if not _store["environment"]:
      _store["environment"] = _environment()
    leaves, tree = jax.tree_util.tree_flatten(args)
    return (tree, tuple(_leaf(x) for x in leaves), static,
            (_store["environment"], _settings())), dict(static)

  def _key(self, signature) -> str:
    """The file name's key: the signature as text, with the environment's."""
    tree, leaves, static, (environment, settings) = signature
    text = repr((environment, settings, self._fun.__module__, self._fun.__qualname__,
                 self._code,
                 [(name, repr(value)) for name, value in static], str(tree),
                 [(shape, str(dtype), weak, _sharding_text(sharding))
                  for shape, dtype, weak, sharding in leaves]))
    return hashlib.sha256(text.encode()).hexdigest()[:32]

  def _path(self, where: Path, key: str) -> Path:
    return where / f"{self._fun.__name__}-{key}.bin"

  def _compile(self, path: Path, key: str, args, static):
    """The program compiled (as jax.jit would), and stored if this process compiled it."""
    for name in (key, f"{key}_{secrets.token_hex(4)}"):
      hits = getattr(_hits, "count", 0)
      compiled = self._named(name).trace(*args, **static).lower().compile()
      if getattr(_hits, "count", 0) == hits:  # (compiled here, not handed over by JAX's cache)
        try:
          _save(path, compiled)
        except OSError as e:  # (e.g. a read-only cache folder: said once, then off)
          log.warning("the program store is off in this process: %s", e)
          _store["folder"] = None
        except Exception as e:  # noqa: BLE001 (a program JAX cannot serialize, e.g. with a
          log.warning("program %s not stored (%s: %s)", self._fun.__qualname__,  # callback)
                      type(e).__name__, e)
        return compiled
    return compiled

  def _named(self, name: str):
    @functools.wraps(self._fun)
    def named(*args, **kwargs):
      return self._fun(*args, **kwargs)
    named.__name__ = f"{self._fun.__name__}_{name}"
    return jax.jit(named, static_argnames=self._static, donate_argnames=self._donate)


def stored_jit(*, static_argnames: tuple[str, ...] = (), donate_argnames: tuple[str, ...] = ()):
  """Decorator: `StoredJit(fun, static_argnames, donate_argnames)` (donated: arguments whose
  buffers the program may reuse for its outputs, e.g. a state it updates)."""
  return functools.partial(StoredJit, static_argnames=static_argnames,
                           donate_argnames=donate_argnames)


def _save(path: Path, compiled):
  serialized, in_tree, out_tree = serialize_executable.serialize(compiled)
  with atomic.replacing(path) as tmp:
    tmp.write_bytes(pickle.dumps((serialized, in_tree, out_tree)))
  _trim(path.parent)


def _trim(where: Path, most: int | None = None):
  """Above `most` bytes (MAX_BYTES), removes the programs used least recently (a load
  touches its file) down to three quarters of it: each version of the package, each
  shape, is a program of its own."""
  most = MAX_BYTES if most is None else most
  files = []
  for path in where.glob("*.bin"):
    try:
      info = path.stat()
    except FileNotFoundError:  # (removed by another process meanwhile)
      continue
    files.append((info.st_mtime, info.st_size, path))
  total = sum(size for _, size, _ in files)
  if total <= most:
    return
  for _, size, path in sorted(files):
    if total <= most * 3 // 4:
      break
    path.unlink(missing_ok=True)
    total -= size


def _load(path: Path):
  """The program stored at `path`, or None (none there, or one that cannot be loaded: then
  removed)."""
  start = time.perf_counter()
  try:
    data = path.read_bytes()
  except OSError:  # (none there, or an unreadable folder: compiled as if none)
    return None
  try:
    program = serialize_executable.deserialize_and_load(*pickle.loads(data))
  except Exception as e:  # (a damaged or foreign file: compiled again, stored anew)
    log.warning("stored program %s cannot be loaded (%s: %s); compiling it again", path,
                type(e).__name__, e)
    path.unlink(missing_ok=True)
    return None
  with contextlib.suppress(OSError):  # (its use, for `_trim`)
    os.utime(path)
  monitoring.record_event_duration_secs(LOAD_EVENT, time.perf_counter() - start)
  return program
