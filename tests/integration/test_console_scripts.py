"""The installed console scripts, as a user runs them: each `--help` lists the tool's own
flags, and a config mistake in a real process ends in one line without a traceback."""

import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

BIN = Path(sys.executable).parent
SCRIPTS = {"train": "--workdir", "evaluate": "--checkpoint", "translate": "--input",
           "average": "--output", "attention-maps": "--sentence", "prepare-data": "--workdir",
           "split-corpus": "--dedup_test_by", "sweep": "--heartbeat_grace",
           "translate-corpus": "--block_lines", "export": "--quantization"}


def test_every_console_script_helps_with_its_own_flags():
  procs = {name: subprocess.Popen([str(BIN / f"transformer-jax-{name}"), "--help"], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for name in SCRIPTS}
  for name, proc in procs.items():
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, (name, err[-2000:])
    assert f"transformer-jax-{name}" in out and f"{SCRIPTS[name]}:" in out, (name, out[:500])
    assert "Try --helpfull" not in out


def test_a_misspelt_override_in_a_real_process_is_one_line(tmp_path):
  r = subprocess.run([str(BIN / "transformer-jax-train"), "--config=configs/tiny.py",
                      f"--workdir={tmp_path}", "--config.model.num_layerz=2"], cwd=ROOT,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 2
  assert r.stderr.strip().splitlines() == [
      "config error: --config.model.num_layerz: config.model has no key 'num_layerz' (did you "
      "mean scan_layers, num_encoder_layers or num_decoder_layers?)"]
  assert not list(tmp_path.iterdir())
