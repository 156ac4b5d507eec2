"""With libtpu installed, a process on a machine without a TPU leaves the TPU out of JAX's
backends when it imports the package, whatever its entry point: no libtpu error lines on
stderr, no second spent looking for chips."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT
from transformer_jax.parallel import platforms


@pytest.mark.parametrize("environ, facts, decided", [
    ({}, dict(libtpu=True, chips=False, plugins=False), "cpu"),
    ({"JAX_PLATFORMS": "tpu"}, dict(libtpu=True, chips=False, plugins=False), "tpu"),
    ({}, dict(libtpu=False, chips=False, plugins=False), None),   # nothing to leave out
    ({}, dict(libtpu=True, chips=True, plugins=False), None),     # a TPU VM: JAX's choice
    ({}, dict(libtpu=True, chips=False, plugins=True), None),     # a GPU plugin: JAX's choice
])
def test_the_tpu_is_left_out_only_where_libtpu_has_no_chip_and_nothing_else_decides(
    environ, facts, decided):
  environ = dict(environ)
  changed = platforms.leave_out_absent_tpu(environ, **facts)
  assert environ.get("JAX_PLATFORMS") == decided
  assert changed == (decided == "cpu")


def test_tpu_chips_are_google_pci_devices_with_a_tpus_device_id(tmp_path):
  def device(slot, vendor, device_id):
    (tmp_path / slot).mkdir()
    (tmp_path / slot / "vendor").write_text(vendor + "\n")
    (tmp_path / slot / "device").write_text(device_id + "\n")
  device("0000:00:04.0", "0x1af4", "0x1000")   # virtio
  device("0000:00:05.0", "0x1ae0", "0x0042")   # Google's gVNIC: a GCP CPU VM
  assert not platforms.tpu_chips_present(tmp_path)
  device("0000:00:06.0", "0x1ae0", "0x0063")   # a TPU v5e chip
  assert platforms.tpu_chips_present(tmp_path)
  assert not platforms.tpu_chips_present(tmp_path / "missing")


def test_a_cuda_plugin_decides_the_backends_only_where_an_nvidia_gpu_is(tmp_path):
  assert not platforms.other_accelerator_plugins({"xla_cuda12"}, nvidia=False)  # gpu-compile
  assert platforms.other_accelerator_plugins({"xla_cuda12"}, nvidia=True)
  assert platforms.other_accelerator_plugins({"xla_cuda12", "xla_rocm"}, nvidia=False)
  assert not platforms.other_accelerator_plugins(set(), nvidia=True)
  (tmp_path / "0000:00:04.0").mkdir()
  (tmp_path / "0000:00:04.0" / "vendor").write_text("0x10de\n")
  (tmp_path / "0000:00:04.0" / "class").write_text("0x068000\n")  # an NVIDIA bridge
  assert not platforms.nvidia_gpus_present(tmp_path)
  (tmp_path / "0000:00:05.0").mkdir()
  (tmp_path / "0000:00:05.0" / "vendor").write_text("0x10de\n")
  (tmp_path / "0000:00:05.0" / "class").write_text("0x030200\n")  # a 3D controller: a GPU
  assert platforms.nvidia_gpus_present(tmp_path)


def _imported(path: Path) -> set[str]:
  """The modules a script imports at its top level, with those of the benchmarks' own helper
  modules it imports (e.g. measure.py)."""
  names = set()
  for node in ast.parse(path.read_text()).body:
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
  for name in list(names):
    helper = path.parent / f"{name}.py"
    if helper.is_file() and helper != path:
      names |= _imported(helper)
  return names


def test_every_script_that_starts_jax_imports_the_package_first():
  """(the package's import is what leaves an absent TPU out: a script importing JAX alone
  would start it loudly)"""
  scripts = [p for p in sorted((ROOT / "benchmarks").glob("*.py")) + [ROOT / "train.py"]
             if "__main__" in p.read_text()]
  assert len(scripts) > 10
  for script in scripts:
    names = _imported(script)
    if any(n.split(".")[0] in ("jax", "flax") for n in names):
      assert any(n.split(".")[0] == "transformer_jax" for n in names), script.name


@pytest.mark.skipif(not platforms.libtpu_installed() or platforms.tpu_chips_present(),
                    reason="needs libtpu installed on a machine without TPU chips")
def test_a_benchmark_starts_jax_silently():
  """A benchmark's start-up (its imports) and then JAX's backend: no libtpu lines."""
  # (without the lockfile: libtpu in a process that finds another holding it fails silently,
  # and the loud process would not be loud)
  env = {**{k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"},
         "ALLOW_MULTIPLE_LIBTPU_LOAD": "1"}
  start = "import jax; jax.devices()"
  quiet = subprocess.run(
      [sys.executable, "-c", "import runpy; runpy.run_path('benchmarks/dus_regression.py'); "
       f"{start}"], env=env, capture_output=True, text=True, cwd=ROOT)
  loud = subprocess.run([sys.executable, "-c", start], env=env, capture_output=True, text=True)
  assert quiet.returncode == loud.returncode == 0
  assert quiet.stderr == ""
  assert "TPU_" in loud.stderr, loud.stderr  # (what the package's import spares every process)
