"""With libtpu installed, a process on a machine without a TPU leaves the TPU out of JAX's
backends: no libtpu error lines on stderr, no second spent looking for chips."""

import os
import subprocess
import sys

import pytest

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


@pytest.mark.skipif(not platforms.libtpu_installed() or platforms.tpu_chips_present(),
                    reason="needs libtpu installed on a machine without TPU chips")
def test_a_process_that_starts_jax_after_the_check_is_silent():
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  start = "import jax; jax.devices()"
  quiet = subprocess.run(
      [sys.executable, "-c", "from transformer_jax.parallel import platforms; "
       f"platforms.leave_out_absent_tpu(); {start}"], env=env, capture_output=True, text=True)
  loud = subprocess.run([sys.executable, "-c", start], env=env, capture_output=True, text=True)
  assert quiet.returncode == loud.returncode == 0
  assert quiet.stderr == ""
  assert "TPU" in loud.stderr, loud.stderr  # (what the check spares every process)
