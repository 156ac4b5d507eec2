"""The matmul input dtype the hardware runs fastest: `config.model.dtype="auto"` resolved.

bf16 inputs with f32 accumulation where the backend multiplies bf16 natively and faster than
f32, exact f32 elsewhere:

- TPUs: bf16. NVIDIA GPUs: bf16 from compute capability 8.0 (Ampere: A100, RTX 30xx; Hopper,
  Ada, Blackwell), f32 below (P100, V100, T4 and older emulate bf16). AMD GPUs: bf16 on the
  CDNA matrix cores (gfx908, gfx90a, gfx94x, gfx95x), f32 elsewhere.
- CPUs whose flags show no native bf16 dot product (no `avx512_bf16` or `amx_bf16` on x86, no
  `bf16` on ARM; e.g. AVX2-only machines): f32 at once; there bf16 is emulated and slower.
- CPUs with one, or no flags to read (not Linux): a short measured probe decides (bf16 against
  f32 matmuls, three times, the median ratio kept; about a second), since a library or an
  `XLA_FLAGS` setting may still run bf16 slowly. Its figures are cached per machine (CPU
  model, flags, jax version and XLA_FLAGS) in the package's cache folder
  (`config.folders.cache_home`: `$XDG_CACHE_HOME/transformer_jax/numerics.json`, or under
  `~/.cache`), so later runs start without it.

Training records the resolved dtype in the workdir's config.json, so a run resumes with the
dtype it trained with, on any machine; decoding tools run a run trained in bf16 in this
machine's choice (`inference.trained_run.load`): bf16 weights lose nothing in f32, and
emulated bf16 would only be slower. On several processes, process 0's choice holds for all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import statistics
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from transformer_jax import atomic
from transformer_jax.config.folders import cache_home
from transformer_jax.config.model import DTYPES
from transformer_jax.parallel.hardware import cpu_info, isa_summary

log = logging.getLogger(__name__)

# /proc/cpuinfo names of native bf16 dot products: x86 (AVX-512 BF16, AMX) and ARM (BFDOT)
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")
MIN_SPEEDUP = 1.25  # bf16 must beat f32 by this factor in the probe to be chosen
PROBE_REPEATS = 3   # the probe's median of this many ratios decides
GPUS = ("gpu", "cuda", "rocm")
NATIVE_BF16_AMD = ("gfx908", "gfx90a", "gfx94", "gfx95")  # CDNA matrix cores (prefixes)


@dataclasses.dataclass(frozen=True)
class Choice:
  dtype: str   # "float32" or "bfloat16"
  reason: str  # why, for the log


def probe_bf16_speedup(n: int = 1024, reps: int = 4, repeats: int = PROBE_REPEATS) -> float:
  """How many times faster an n³ matmul runs with bf16 inputs (f32 accumulation) than in f32
  on the default device: the median over `repeats` of the ratio of the best of `reps`
  timings of each (a single ratio taken while another process is busy misleads)."""
  def best_seconds(dtype) -> float:
    a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
    f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
    f(a, a).block_until_ready()
    times = []
    for _ in range(reps):
      t = time.perf_counter()
      f(a, a).block_until_ready()
      times.append(time.perf_counter() - t)
    return min(times)
  return statistics.median(best_seconds(jnp.float32) / best_seconds(jnp.bfloat16)
                           for _ in range(repeats))


def machine_key(cpu_model: str, flags: Iterable[str]) -> str:
  """What the probe's result depends on: the CPU, its flags, jax and the XLA flags."""
  text = "|".join([cpu_model, " ".join(sorted(flags)), jax.__version__,
                   os.environ.get("XLA_FLAGS", "")])
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def accelerator_choice(backend: str, capability: str) -> Choice:
  """bf16 on TPUs and on GPUs that multiply it natively (see the module docstring), from the
  device's compute capability ("8.0" on NVIDIA, e.g. "gfx90a" on AMD)."""
  if backend == "tpu":
    return Choice("bfloat16", "TPUs multiply bf16 natively")
  if capability.startswith("gfx"):
    if capability.startswith(NATIVE_BF16_AMD):
      return Choice("bfloat16", f"the AMD GPU ({capability}) multiplies bf16 natively")
    return Choice("float32", f"the AMD GPU ({capability}) has no bf16 matrix cores: bf16 "
                  "would be emulated")
  try:
    major = int(capability.split(".")[0])
  except ValueError:
    return Choice("float32", f"the GPU's compute capability is unknown ({capability!r})")
  if major >= 8:
    return Choice("bfloat16", f"the GPU (compute capability {capability}) multiplies bf16 "
                  "natively")
  return Choice("float32", f"the GPU (compute capability {capability}, below 8.0) would "
                "emulate bf16")


def choose(backend: str, cpu_model: str, flags: frozenset[str],
           probe: Callable[[], float] = probe_bf16_speedup, cache: Path | None = None,
           capability: str = "") -> Choice:
  """The dtype `auto` means for this backend (`capability`: an accelerator's, see
  accelerator_choice) and CPU (see the module docstring). `cache`: the probe's figures
  (default: numerics.json in the package's cache folder)."""
  if backend in GPUS or backend == "tpu":
    return accelerator_choice(backend, capability)
  if backend != "cpu":
    return Choice("float32", f"unknown backend {backend!r}")
  native = sorted(set(flags) & set(BF16_CPU_FLAGS))
  if flags and not native:
    return Choice("float32", f"the CPU has no native bf16 dot product ({isa_summary(flags)}): "
                  "bf16 would be emulated, slower than f32")
  key = machine_key(cpu_model, flags)
  cache = cache or cache_home() / "numerics.json"
  cached = _read_cache(cache)
  entry = cached.get(key)
  if isinstance(entry, dict) and isinstance(entry.get("bf16_speedup"), (int, float)):
    speedup, how = float(entry["bf16_speedup"]), f"cached in {cache}"
  else:
    speedup, how = probe(), "measured now"
    _write_cache(cache, {**cached, key: {"bf16_speedup": speedup, "cpu": cpu_model,
                                         "xla_flags": os.environ.get("XLA_FLAGS", "")}})
  has = f"the CPU has {', '.join(native)}" if native else "the CPU flags are unknown"
  verdict = "bfloat16" if speedup >= MIN_SPEEDUP else "float32"
  return Choice(verdict, f"{has}; bf16 matmuls ran {speedup:.2f}x as fast as f32 ({how}; "
                f"bf16 needs {MIN_SPEEDUP}x)")


def resolve(requested: str, recorded: str | None = None) -> Choice:
  """The dtype a run uses: an explicit `requested` dtype; for "auto", the one `recorded` in
  the workdir (the run resumes as it trained), else the one this hardware runs fastest."""
  if requested != "auto":
    return Choice(requested, "set in the config")
  if recorded in DTYPES:
    choice = Choice(recorded, "recorded in the workdir's config.json: the dtype the run "
                    "trained with")
  else:
    device = jax.devices()[0]
    choice = choose(jax.default_backend(), *cpu_info(),
                    capability=str(getattr(device, "compute_capability", "") or ""))
  if jax.process_count() > 1:  # every process computes what process 0 chose
    index = int(multihost_utils.broadcast_one_to_all(np.int32(DTYPES.index(choice.dtype))))
    if DTYPES[index] != choice.dtype:
      choice = Choice(DTYPES[index], f"process 0's choice (here: {choice.reason})")
  return choice


def _read_cache(path: Path) -> dict:
  try:
    data = json.loads(path.read_text())
  except (OSError, ValueError):  # none yet, or damaged: measured again and rewritten
    return {}
  return data if isinstance(data, dict) else {}


def _write_cache(path: Path, data: dict):
  try:
    atomic.write_json(path, data, indent=1, sort_keys=True)
  except OSError as e:  # a read-only home: the probe runs again next time
    log.warning("could not cache the numerics probe in %s: %s", path, e)
