"""What machine this is, as every speed figure names it: the CPU model and the ISA flags that
decide matmul speed (read from /proc/cpuinfo; no JAX imported)."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from pathlib import Path


def cpu_info(path: str = "/proc/cpuinfo") -> tuple[str, frozenset[str]]:
  """(model name, ISA flags) of this machine's CPU; ("", {}) where they cannot be read."""
  try:
    text = Path(path).read_text(errors="replace")
  except OSError:
    return "", frozenset()
  model, flags = "", frozenset()
  for line in text.splitlines():
    key, _, value = line.partition(":")
    key = key.strip()
    if key == "model name" and not model:
      model = value.strip()
    elif key in ("flags", "Features") and not flags:
      flags = frozenset(value.split())
  return model, flags


def isa_summary(flags: Iterable[str]) -> str:
  """The flags that matter for matmul speed, e.g. 'avx2 fma avx512f avx512_bf16'."""
  wanted = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "neon", "asimd",
            "bf16", "sve")
  present = set(flags)
  return " ".join(f for f in wanted if f in present) or "unknown"


def describe_machine() -> str:
  """'AMD EPYC, 2 cores (avx2 fma avx512f avx512_bf16)': what every speed figure names, with
  the XLA_FLAGS in effect."""
  model, flags = cpu_info()
  text = f"{model or platform.machine()}, {os.cpu_count()} cores ({isa_summary(flags)})"
  if os.environ.get("XLA_FLAGS"):
    text += f", XLA_FLAGS={os.environ['XLA_FLAGS']}"
  return text
