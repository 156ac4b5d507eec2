"""The tiny config compiled by XLA's CUDA compiler for 8 H100s this machine does not have
(the CUDA plugin from `make install-test`'s folder on the tool's PYTHONPATH), and a run too
big for one A100 refused in one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ONE_LAYER_FLAGS, ROOT, one_line_error, xla_env

GPU_COMPILE_DIR = Path(sys.prefix) / "gpu-compile"  # (make install-test puts the plugin there)


@pytest.mark.skipif(not GPU_COMPILE_DIR.is_dir(), reason=f"the CUDA plugin is not in "
                    f"{GPU_COMPILE_DIR} (make install-test puts it there)")
def test_the_tiny_config_compiles_for_8_h100s_and_a_run_too_big_for_one_a100_is_refused(
    tmp_path):
  env = {**xla_env(1), "PYTHONPATH": os.pathsep.join([str(GPU_COMPILE_DIR), str(ROOT)])}
  compile_tool = [sys.executable, "-m", "transformer_jax.cli.compile", "--config=configs/tiny.py",
                  "--programs=train", *ONE_LAYER_FLAGS]
  # (128 rows: 512 target tokens a GPU, one loss tile in a program traced for a GPU, two of
  # the configured 256 in one traced for this CPU)
  fits = subprocess.run([*compile_tool, "--target=h100-8", f"--json={tmp_path}/h100.json",
                         "--config.data.batch_size=128"],
                        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert fits.returncode == 0, fits.stderr[-2000:]
  (step,) = json.loads((tmp_path / "h100.json").read_text())["reports"]
  assert step["fits"] and step["method"] == "GPU roofline" and step["num_devices"] == 8
  assert 0 < step["memory"]["arguments"] < 2**20  # (the tiny model, f32 with Adam's moments)
  assert step["collectives"]["all-reduce"]["count"] > 0  # the gradients, data parallel
  assert step["seconds"] > 0 and step["device_flops"] == step["model_flops"] / 8
  assert step["loops"] == []  # (traced for the GPU: its loss tile, not the CPU's)
  # (5.6 billion parameters, f32 with Adam's two moments: 63 GiB of arguments alone)
  too_big = subprocess.run([*compile_tool, "--target=a100-1", "--config.model.d_model=8192",
                            "--config.model.d_ff=16384", "--config.model.vocab_size=524288",
                            "--config.model.num_heads=64"],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert too_big.returncode == 1, too_big.stderr[-2000:]
  line = one_line_error(too_big.stderr)
  assert "train_step does not fit a100-1: needs" in line and "of 80 GiB: short by" in line
  assert "--config.num_micro_batches=2" in line
