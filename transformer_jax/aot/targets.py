"""The accelerators a program can be compiled for without them, and what each chip offers
(peak bf16 matmul rate, HBM and its bandwidth; the vendor's figures): Cloud TPU slices, whose
devices `jax.experimental.topologies` describes with libtpu on any machine, and NVIDIA GPU
servers, described to XLA's CUDA compiler (the CUDA plugin; no GPU, driver or toolkit needed)
by a device description made here from the GPU's published figures.

A TPU target is named as Google Cloud names the slice: `v5e-8` (8 chips), `v5p-8` and `v4-8`
(8 TensorCores: 4 chips, each two cores working as one device, "megacore"), `v6e-8`;
`tpu-` in front is accepted. A GPU target is the GPU and how many of them one host holds:
`h100-8`, `a100-1`."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os

from jax.experimental import topologies

from transformer_jax.errors import Error, UsageError
from transformer_jax.parallel.platforms import libtpu_installed, tpu_chips_present


@dataclasses.dataclass(frozen=True)
class Chip:
  name: str
  device_kind: str           # what JAX reports for its devices
  peak_bf16_flops: float     # per second, dense bf16 matmuls
  hbm_bytes: int
  hbm_bytes_per_second: float
  source: str                # where the figures are published
  gpu: GpuFacts | None = None


@dataclasses.dataclass(frozen=True)
class GpuFacts:
  """What XLA's CUDA compiler is told of a GPU it cannot query (its GpuDeviceInfo), and the
  links between the GPUs of one host."""
  compute_capability: tuple[int, int]
  cores: int                 # streaming multiprocessors
  clock_ghz: float           # boost
  l2_bytes: int
  shared_memory_per_core: int
  shared_memory_per_block_optin: int
  link_bytes_per_second: float  # NVLink, each direction, per GPU


GiB = 2**30
CHIPS = {
    "v4": Chip("TPU v4", "TPU v4", 275e12, 32 * GiB, 1200e9,
               "https://cloud.google.com/tpu/docs/v4"),
    "v5e": Chip("TPU v5e", "TPU v5 lite", 197e12, 16 * GiB, 819e9,
                "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("TPU v5p", "TPU v5", 459e12, 95 * GiB, 2765e9,
                "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("TPU v6e", "TPU v6 lite", 918e12, 32 * GiB, 1640e9,
                "https://cloud.google.com/tpu/docs/v6e"),
}
MiB = 2**20
GPUS = {
    "a100": Chip("NVIDIA A100 80GB SXM", "NVIDIA A100-SXM4-80GB", 312e12, 81920 * MiB, 2039e9,
                 "https://www.nvidia.com/en-us/data-center/a100/",
                 GpuFacts((8, 0), 108, 1.41, 40 * MiB, 167936, 166912, 300e9)),
    "h100": Chip("NVIDIA H100 80GB SXM", "NVIDIA H100 80GB HBM3", 989e12, 81559 * MiB, 3350e9,
                 "https://www.nvidia.com/en-us/data-center/h100/",
                 GpuFacts((9, 0), 132, 1.98, 50 * MiB, 233472, 232448, 450e9)),
    # (memory: what the H200 lent to gpu_check.py reported, 143,771 MiB)
    "h200": Chip("NVIDIA H200 141GB SXM", "NVIDIA H200", 989e12, 143771 * MiB, 4800e9,
                 "https://www.nvidia.com/en-us/data-center/h200/",
                 GpuFacts((9, 0), 132, 1.98, 50 * MiB, 233472, 232448, 450e9)),
}


@dataclasses.dataclass(frozen=True)
class Target:
  name: str                  # e.g. "v5e-8", "h100-8"
  chip: Chip
  topology: str              # libtpu's topology name, e.g. "v5e:2x4"; a GPU host's "1x1x8"
  chip_config: str           # "megacore" (v4, v5p) or "default"
  chips_per_host: tuple[int, int, int]
  num_slices: int = 1

  @property
  def platform(self) -> str:
    return "gpu" if self.chip.gpu is not None else "tpu"

  @property
  def num_chips(self) -> int:
    shape = [int(x) for x in self.topology.split(":")[-1].split("x")]
    return math.prod(shape) * self.num_slices


# (slice name: topology, chips per host); the slices of one or a few hosts, as MaxText's
# accelerator_to_spec_map and Google Cloud's tables describe them
_SLICES = {
    "v4-8": ("v4:2x2x1", (2, 2, 1)), "v4-16": ("v4:2x2x2", (2, 2, 1)),
    "v4-32": ("v4:2x2x4", (2, 2, 1)),
    "v5p-8": ("v5:2x2x1", (2, 2, 1)), "v5p-16": ("v5:2x2x2", (2, 2, 1)),
    "v5p-32": ("v5:2x2x4", (2, 2, 1)),
    "v5e-1": ("v5e:1x1", (1, 1, 1)), "v5e-4": ("v5e:2x2", (2, 2, 1)),
    "v5e-8": ("v5e:2x4", (2, 4, 1)), "v5e-16": ("v5e:4x4", (2, 2, 1)),
    "v6e-1": ("v6e:1x1", (1, 1, 1)), "v6e-4": ("v6e:2x2", (2, 2, 1)),
    "v6e-8": ("v6e:2x4", (2, 4, 1)), "v6e-16": ("v6e:4x4", (2, 2, 1)),
}
GPUS_PER_HOST = (1, 8)
NAMES = tuple(_SLICES) + tuple(f"{gpu}-{n}" for gpu in GPUS for n in GPUS_PER_HOST)
DESCRIBED_ELSEWHERE = {"TPU_SKIP_MDS_QUERY": "1", "TPU_WORKER_HOSTNAMES": "localhost",
                       "TPU_HOST_BOUNDS": "1,1,1",
                       # several compiles at once (no chips to share): libtpu's lock file
                       # would refuse all but the first
                       "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}


def target(name: str, num_slices: int = 1) -> Target:
  """The target called `name` ("v5e-8" or "tpu-v5e-8"), `num_slices` slices of it joined by
  the data-center network; a UsageError naming the known ones otherwise."""
  key = name.lower()
  slice_name = key.removeprefix("tpu-")
  key = slice_name if slice_name in _SLICES else key
  if key not in NAMES:
    raise UsageError(f"unknown --target {name!r}; known: {', '.join(NAMES)}")
  if num_slices < 1:
    raise UsageError(f"--slices={num_slices} must be at least 1")
  if key not in _SLICES:
    if num_slices != 1:
      raise UsageError(f"--slices={num_slices}: a GPU target is one host ({key})")
    gpu, count = key.split("-")
    return Target(key, GPUS[gpu], f"1x1x{count}", "default", (1, 1, int(count)))
  topology, per_host = _SLICES[key]
  family = key.split("-")[0]
  return Target(key, CHIPS[family], topology, "megacore" if family in ("v4", "v5p")
                else "default", per_host, num_slices)


def describe(t: Target) -> str:
  chip = t.chip
  return (f"{t.name} x{t.num_slices} ({t.num_chips} chips of {chip.name}: "
          f"{chip.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16, {chip.hbm_bytes / GiB:.0f} GiB HBM, "
          f"{chip.hbm_bytes_per_second / 1e9:.0f} GB/s; {chip.source})")


def gpu_description(chip: Chip) -> str:
  """The GPU described as XLA's CUDA compiler would find it on the device (a
  GpuTargetConfigProto, as text)."""
  g = chip.gpu
  return f"""gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 threads_per_core_limit: 2048
  shared_memory_per_block: 49152 shared_memory_per_core: {g.shared_memory_per_core}
  shared_memory_per_block_optin: {g.shared_memory_per_block_optin}
  core_count: {g.cores} fpus_per_core: 128 clock_rate_ghz: {g.clock_ghz}
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {int(chip.hbm_bytes_per_second)} l2_cache_size: {g.l2_bytes}
  device_memory_size: {chip.hbm_bytes}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
  cuda_compute_capability {{ major: {g.compute_capability[0]} minor: {g.compute_capability[1]} }}
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 1 }}
device_description_str: "{chip.device_kind}"
"""


def gpu_chip(device_kind: str) -> Chip | None:
  """The GPU whose devices JAX names `device_kind` (a GPU of one of the targets), or None."""
  return next((c for c in GPUS.values() if c.device_kind == device_kind), None)


def cuda_plugin_installed() -> bool:
  return importlib.util.find_spec("jax_cuda12_plugin") is not None


def devices(t: Target) -> list:
  """The target's devices, described by libtpu or the CUDA plugin (no TPU or GPU needed); an
  Error saying how to install the one missing."""
  if t.platform == "gpu":
    return _gpu_devices(t)
  if not libtpu_installed():
    raise Error(f"--target {t.name} needs libtpu, the TPU compiler: pip install "
                "'transformer_jax[tpu]'")
  # Without these libtpu looks for the TPU VM it runs on (metadata server, worker names) and
  # prints its failures; the topology's own arguments describe the devices either way. Set
  # only while libtpu starts (it reads them once): TPU_WORKER_HOSTNAMES left behind would
  # tell jax.distributed (distributed.py) that this process is on a TPU pod; and not on a
  # TPU VM, whose own TPU backend needs the real values.
  quieted = {} if tpu_chips_present() else {
      k: v for k, v in DESCRIBED_ELSEWHERE.items() if k not in os.environ}
  os.environ.update(quieted)
  try:
    return list(topologies.get_topology_desc(
        platform="tpu", topology_name=t.topology, chip_config_name=t.chip_config,
        chips_per_host_bounds=t.chips_per_host, num_slices=t.num_slices).devices)
  except Exception as e:  # noqa: BLE001 (libtpu's errors: one line, not a traceback)
    raise Error(f"libtpu could not describe {t.name} ({t.topology}): "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
  finally:
    for name in quieted:
      os.environ.pop(name, None)


def _gpu_devices(t: Target) -> list:
  if not cuda_plugin_installed():
    raise Error(f"--target {t.name} needs the CUDA plugin, XLA's GPU compiler: pip install "
                "'transformer_jax[gpu-compile]'")
  try:
    return list(topologies.get_topology_desc(
        platform="cuda", topology_name="", target_config=gpu_description(t.chip),
        topology=t.topology).devices)
  except Exception as e:  # noqa: BLE001 (the plugin's errors: one line, not a traceback)
    raise Error(f"the CUDA plugin could not describe {t.name}: "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from e
