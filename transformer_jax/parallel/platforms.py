"""Which JAX backends a process starts. With libtpu installed (the `tpu` extra, for
`transformer-jax-compile`), JAX tries a TPU before anything else in every process, also on a
machine without one: libtpu prints several error lines on stderr before JAX falls back to
the CPU. On such a machine the TPU is left out, unless the user chose the backends
(JAX_PLATFORMS) or another accelerator plugin is installed (then JAX's own choice stands):
the package's import does it, so every entry point starts quietly. A CUDA plugin on a machine
without an NVIDIA GPU (installed to compile for GPUs) decides nothing. The TPU compiler stays
usable without the backend: `jax.experimental.topologies` loads libtpu by itself."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import pkgutil
import sys
from collections.abc import MutableMapping
from pathlib import Path

GOOGLE_PCI_VENDOR = "0x1ae0"
# The PCI device ids of TPU chips (v3, plc, v4, v5p, v5e, v6e, 7x), as JAX's hardware_utils
# lists them: Google's vendor id alone also covers every Compute Engine VM's gVNIC and NVMe.
TPU_PCI_DEVICES = frozenset({"0x0027", "0x0056", "0x005e", "0x0062", "0x0063", "0x006f",
                             "0x0076"})


def libtpu_installed() -> bool:
  return importlib.util.find_spec("libtpu") is not None


def _pci(pci_devices: Path, *fields: str) -> list[tuple[str, ...]]:
  """The `fields` (e.g. vendor, device) of each PCI device that has them all."""
  try:
    devices = list(pci_devices.iterdir())
  except OSError:
    return []
  found = []
  for device in devices:
    try:
      found.append(tuple((device / f).read_text().strip() for f in fields))
    except OSError:
      continue
  return found


def tpu_chips_present(pci_devices: Path = Path("/sys/bus/pci/devices")) -> bool:
  """Whether this machine has a TPU chip (a PCI device of Google's vendor and a TPU's device
  id; JAX's own check)."""
  return any(vendor == GOOGLE_PCI_VENDOR and device in TPU_PCI_DEVICES
             for vendor, device in _pci(pci_devices, "vendor", "device"))


NVIDIA_PCI_VENDOR = "0x10de"
CUDA_PLUGINS = ("xla_cuda12", "xla_cuda13")


def plugin_names() -> set[str]:
  """The PJRT plugins installed other than libtpu (JAX's two ways of finding them: entry
  points of the group `jax_plugins`, modules of the namespace package `jax_plugins`)."""
  names = {ep.name for ep in importlib.metadata.entry_points(group="jax_plugins")}
  spec = importlib.util.find_spec("jax_plugins")
  for folder in (spec.submodule_search_locations or []) if spec else []:
    names |= {m.name for m in pkgutil.iter_modules([folder])}
  return names


def nvidia_gpus_present(pci_devices: Path = Path("/sys/bus/pci/devices")) -> bool:
  """Whether this machine has an NVIDIA GPU (a PCI display controller of NVIDIA's vendor)."""
  return any(vendor == NVIDIA_PCI_VENDOR and device_class.startswith("0x03")
             for vendor, device_class in _pci(pci_devices, "vendor", "class"))


def other_accelerator_plugins(names: set[str] | None = None,
                              nvidia: bool | None = None) -> bool:
  """Whether a PJRT plugin other than libtpu is installed (CUDA, ROCm, ...) that may find
  its hardware: a CUDA plugin on a machine without an NVIDIA GPU (the `gpu-compile` extra,
  for compiling for GPUs) decides nothing. (`names`, `nvidia`: the facts, for tests.)"""
  names = plugin_names() if names is None else set(names)
  if not (nvidia_gpus_present() if nvidia is None else nvidia):
    names -= set(CUDA_PLUGINS)
  return bool(names)


def leave_out_absent_tpu(environ: MutableMapping[str, str] = os.environ, *,
                         libtpu: bool | None = None, chips: bool | None = None,
                         plugins: bool | None = None) -> bool:
  """Sets JAX_PLATFORMS=cpu (in `environ`, and in JAX's config if JAX is imported) when libtpu
  is installed on a machine without TPU chips and nothing else decides the backends; returns
  whether it did. (`libtpu`, `chips`, `plugins`: the facts, for tests; default: looked up.)"""
  if environ.get("JAX_PLATFORMS"):
    return False
  if not (libtpu_installed() if libtpu is None else libtpu):
    return False
  if (tpu_chips_present() if chips is None else chips):
    return False
  if (other_accelerator_plugins() if plugins is None else plugins):
    return False
  environ["JAX_PLATFORMS"] = "cpu"
  if environ is os.environ and "jax" in sys.modules:  # (JAX read the variable at its import)
    sys.modules["jax"].config.update("jax_platforms", "cpu")
  return True
