"""The compile tool's GPU targets: what a name means, the predicted step time from the model's
FLOPs and the HLO's traffic, a machine without the CUDA plugin told how to install it.
(Compiled by XLA's CUDA compiler: integration/test_gpu_compile.py.)"""

import dataclasses

import pytest

from tests.helpers import one_line_error, run_tool
from transformer_jax.aot import hlo, report, targets
from transformer_jax.cli import compile as compile_cli
from transformer_jax.errors import UsageError


def test_a_gpu_target_is_one_host_of_that_gpu():
  h100 = targets.target("h100-8")
  assert (h100.platform, h100.num_chips, h100.chip.gpu.compute_capability) == ("gpu", 8, (9, 0))
  a100 = targets.target("a100-1")
  assert (a100.num_chips, a100.chip.peak_bf16_flops, a100.chip.gpu.cores) == (1, 312e12, 108)
  assert targets.target("v5e-4").platform == "tpu"
  with pytest.raises(UsageError, match="a GPU target is one host"):
    targets.target("h200-8", num_slices=2)
  with pytest.raises(UsageError, match="h100-8, h200-1"):
    targets.target("h100-4")
  text = targets.gpu_description(targets.GPUS["h200"])
  assert "core_count: 132" in text and "memory_bandwidth: 4800000000000" in text
  assert 'device_description_str: "NVIDIA H200"' in text and "major: 9 minor: 0" in text


def test_collectives_take_a_rings_time_on_the_links_of_their_group():
  groups = {"all-reduce": [(None, 800)] * 2, "all-gather": [(8, 400)],
            "reduce-scatter": [(4, 100)]}  # (None: the whole mesh of 8)
  # 2 x (2 x 7/8 of 800 bytes), 7/8 of 400, 3 x 100 (a group of 4), at 100 bytes/s
  assert report.link_seconds(groups, 8, 100.0) == pytest.approx((2800 + 350 + 300) / 100)
  assert report.link_seconds({"all-reduce": [(1, 800)]}, 1, 100.0) == 0.0


STEP = """HloModule step

ENTRY %main (a: f32[1024,1024]) -> f32[1024,1024] {
  %a = f32[1024,1024]{1,0} parameter(0)
  %b = f32[1024,1024]{1,0} exponential(%a), metadata={op_name="jit(s)/Transformer/x"}
  ROOT %s = f32[1024,1024]{1,0} all-reduce(%b), replica_groups={{0,1}}, to_apply=%add
}
"""


@pytest.mark.parametrize("model_flops, link_bytes_per_second, bound", [
    (2e12, None, "compute"), (2e6, 1e15, "memory"), (2e6, 1e6, "links")])
def test_the_gpu_step_time_is_its_roofline_over_the_share_a_gpu_reached(
    model_flops, link_bytes_per_second, bound):
  module = hlo.Module.parse(STEP)
  chip = targets.GPUS["h100"]
  if link_bytes_per_second:  # (links as fast or as slow as the case needs)
    chip = dataclasses.replace(chip, gpu=dataclasses.replace(
        chip.gpu, link_bytes_per_second=link_bytes_per_second))
  got = report.gpu_estimate(module, model_flops, chip, num_devices=2)
  times = {"compute": model_flops / 2 / chip.peak_bf16_flops,    # each GPU's half
           "memory": 2 * 4 * 2**20 / chip.hbm_bytes_per_second,  # exp reads, writes 4 MiB
           "links": 4 * 2**20 / chip.gpu.link_bytes_per_second}   # 2 x 1/2 of 4 MiB
  assert max(times, key=times.get) == bound
  assert got.roofline == pytest.approx(times[bound])
  assert got.seconds == pytest.approx(got.roofline / report.GPU_ROOFLINE_SHARE)
  assert (got.flops, got.bytes, got.method) == (model_flops / 2, 2 * 4 * 2**20, "GPU roofline")


def test_a_machine_without_the_cuda_plugin_is_told_how_to_install_it(monkeypatch):
  monkeypatch.setattr(targets, "cuda_plugin_installed", lambda: False)
  status, _, err = run_tool(compile_cli.main, "--config=configs/tiny.py", "--target=h100-8")
  assert status == 1
  assert one_line_error(err) == ("compile: --target h100-8 needs the CUDA plugin, XLA's GPU "
                                 "compiler: pip install 'transformer_jax[gpu-compile]'")
