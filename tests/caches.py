"""What the test suite keeps between runs, per machine, under `.test-cache/<machine>/` in the
checkout (TRANSFORMER_JAX_TEST_CACHE moves it): JAX's compilation cache (pruned to
MAX_JAX_CACHE_BYTES, oldest first), and the prepared data and tokenizer of the tiny config in a
folder named by a fingerprint of what they are made from. The machine key covers the CPU model,
its ISA flags, jax's version and the suite's XLA flags, as the tools' own cache does.

Also the suite's XLA flags: unoptimised code generation, which halves the compile time that
dominates the tests of tiny models (TRANSFORMER_JAX_TEST_XLA_FLAGS replaces them; "" for XLA's
defaults). Imported by conftest before JAX: nothing here imports it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.metadata
import os
import shutil
from pathlib import Path

from transformer_jax.parallel.hardware import cpu_info  # (imports no JAX)

ROOT = Path(__file__).resolve().parents[1]
SUITE_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
MAX_JAX_CACHE_BYTES = 2 << 30
# What the prepared corpus and tokenizer are made from.
DATA_SOURCES = ["transformer_jax/data", "transformer_jax/corpora", "transformer_jax/configs",
                "transformer_jax/config"]


def suite_xla_flags() -> str:
  return os.environ.get("TRANSFORMER_JAX_TEST_XLA_FLAGS", SUITE_XLA_FLAGS)


def machine_key(xla_flags: str) -> str:
  model, flags = cpu_info()
  text = "|".join([model, " ".join(sorted(flags)), importlib.metadata.version("jax"), xla_flags])
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_root(xla_flags: str) -> Path:
  base = Path(os.environ.get("TRANSFORMER_JAX_TEST_CACHE", ROOT / ".test-cache"))
  return base / machine_key(xla_flags)


def data_fingerprint() -> str:
  """A hash of the files the prepared data and tokenizer come from, and of the libraries that
  write them: a change to any makes a new folder."""
  digest = hashlib.sha256()
  for package in ("tensorflow-datasets", "sentencepiece", "grain", "array-record"):
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
      digest.update(f"{package}={importlib.metadata.version(package)}".encode())
  for source in DATA_SOURCES:
    for path in sorted((ROOT / source).rglob("*")):
      if path.is_file() and "__pycache__" not in path.parts:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
  return digest.hexdigest()[:12]


def built_once(folder: Path, build) -> Path:
  """`folder`, built by `build(folder)` by the first process to get here (the others wait for
  it, under a file lock); a failed build is redone by the next caller."""
  folder.parent.mkdir(parents=True, exist_ok=True)
  with open(f"{folder}.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not (folder / ".done").is_file():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir()
      build(folder)
      (folder / ".done").touch()
  return folder


def prune(root: Path, keep_data: str):
  """The JAX cache cut to MAX_JAX_CACHE_BYTES (least recently used first) and the data
  folders of other fingerprints removed."""
  for old in root.glob("data_*"):
    if old.is_dir() and old.name != f"data_{keep_data}":
      shutil.rmtree(old, ignore_errors=True)
      old.with_name(old.name + ".lock").unlink(missing_ok=True)
  entries = [p for p in (root / "jax_cache").rglob("*") if p.is_file()]
  stats = {p: p.stat() for p in entries}
  total = sum(s.st_size for s in stats.values())
  for path in sorted(entries, key=lambda p: max(stats[p].st_atime, stats[p].st_mtime)):
    if total <= MAX_JAX_CACHE_BYTES:
      break
    total -= stats[path].st_size
    path.unlink(missing_ok=True)
