"""The tiny config compiled by the real TPU compiler for a 4-chip v5e it does not have: what
each mesh strategy must show in the optimised HLO, a run too big for the chip refused in one
line, and a user's mistakes as one line each."""

import os

import jax
import pytest

from tests import helpers
from tests.helpers import ONE_LAYER, ONE_LAYER_FLAGS, one_line_error, run_tool, tiny_train_config
from transformer_jax.aot import check, hlo, programs, targets
from transformer_jax.cli import compile as compile_cli
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel.platforms import libtpu_installed
from transformer_jax.training.settled_config import make_mesh
from transformer_jax.training.state import abstract_state

pytestmark = pytest.mark.skipif(
    not libtpu_installed(), reason="libtpu (the `tpu` extra) is not installed: the TPU compiler "
    "is missing (pip install -e '.[tpu]')")

TARGET = "v5e-4"
# The tiny config's batch and row length, and a width at which each FSDP piece of a matrix
# has 16 rows (D_MODEL / 4): pieces of 8 rows, of the tiny width of 32, the TPU compiler
# sums by all-reduce and slice, as its cost model prefers at that size.
ROWS, LENGTH, D_MODEL = 16, 32, 64
MESHES = {"data": (-1, 1, 1), "fsdp": (1, -1, 1), "tensor": (1, 1, -1)}


@pytest.fixture(scope="module")
def compiled():
  """Each strategy's train step, compiled for the target: (memory, HLO module); and the
  parameters' bytes."""
  target = targets.target(TARGET)
  devices = targets.devices(target)
  out = {}
  with check.without_persistent_cache():
    for name, shape in MESHES.items():
      cfg = check.for_target(tiny_train_config(**ONE_LAYER, **{
          "parallelism.mesh_shape": shape, "model.d_model": D_MODEL}))
      exe = programs.train_program(cfg, make_mesh(cfg, devices)).lower().compile()
      out[name] = (exe.memory_analysis(), hlo.Module.parse(exe.as_text()))
      if name == "fsdp":
        params = abstract_state(cfg, Transformer(cfg.model), make_mesh(cfg, devices)).params
        out["fsdp_split"] = helpers.fsdp_split(params, jax.tree.map(lambda x: x.sharding, params))
  out["params_bytes"] = _bytes(jax.tree.leaves(params))
  return out


def _bytes(arrays) -> int:
  return sum(x.size * x.dtype.itemsize for x in arrays)


def test_data_parallel_all_reduces_the_gradients_and_gathers_no_parameter(compiled):
  _, module = compiled["data"]
  found = module.collectives()
  assert found["all-gather"].count == 0
  assert found["all-reduce"].bytes >= compiled["params_bytes"]  # every gradient, summed whole
  # the TPU compiler's estimated cycles, by block (the report's "compiler's time")
  cycles = module.cycles_by_block()
  assert min(cycles["attention"], cycles["feed-forward"], cycles["output layer and loss"]) > 0


def test_fsdp_gathers_the_parameters_and_reduce_scatters_the_gradients(compiled):
  data_memory, _ = compiled["data"]
  memory, module = compiled["fsdp"]
  split, _ = compiled["fsdp_split"]
  found = module.collectives()
  assert found["all-gather"].bytes >= 0.5 * compiled["params_bytes"]
  # each chip receives the sum of its quarter of every split matrix's gradient, and no such
  # gradient is summed whole; what is all-reduced is the vectors (biases, norms' scales:
  # a few KB, the compiler's choice at that size; data parallelism all-reduces every
  # parameter's gradient) and the loss's sums
  assert helpers.whole_gradient_sums(module, split) == []
  matrices = [x for x in split if len(x.shape) > 1]
  assert found["reduce-scatter"].bytes >= _bytes(matrices) / 4
  assert found["all-reduce"].bytes <= 0.05 * compiled["params_bytes"]
  # the activations keep their model dimension whole: no all-to-all moving them between
  # layouts, and about one gather of the parameters a step
  assert found["all-to-all"].count == 0
  assert found["all-gather"].bytes <= 2 * compiled["params_bytes"]
  # each chip keeps a quarter of the parameters and optimizer state (arrays this small are
  # padded to the TPU's (8, 128) tiles: less than 4x smaller)
  assert memory.argument_size_in_bytes < 0.8 * data_memory.argument_size_in_bytes


def test_tensor_parallelism_reduces_activations_inside_the_layers(compiled):
  for block in ("attention", "feed_forward"):  # (heads and the FFN width split over `tensor`)
    for strategy, expected in (("tensor", True), ("data", False)):
      _, module = compiled[strategy]
      shapes = module.result_shapes("all-reduce", where=block)
      assert any(s[:2] == (ROWS, LENGTH) and s[-1] == D_MODEL for s in shapes) == expected, \
          (block, strategy, shapes)


def test_a_run_too_big_for_the_chip_is_refused_in_one_line_naming_the_levers():
  status, out, err = run_tool(
      compile_cli.main, "--config=configs/tiny.py", f"--target={TARGET}", "--programs=train",
      *ONE_LAYER_FLAGS, "--config.model.vocab_size=262144", "--config.model.d_model=4096",
      "--config.model.num_heads=32")
  line = one_line_error(err)
  assert status == 1, err
  assert "train_step does not fit v5e-4" in line and "HBM" in line
  assert "--config.num_micro_batches=2" in line and "remat" in line and "(1,-1,1)" in line
  assert "train_step on v5e-4: does not fit" in out


@pytest.mark.parametrize("argv, expected", [
    (["--target=v9x-8"], "compile: unknown --target 'v9x-8'; known: v4-8"),
    (["--target=v5e-4", "--config.parallelism.mesh_shape=(3,1,1)"],
     "config error: config.parallelism.mesh_shape=(3, 1, 1) does not fit the 4 available"),
    (["--target=v5e-4", "--programs=train,decode"], "--programs='train,decode': choose from"),
])
def test_a_users_mistake_is_one_line(argv, expected):
  status, _, err = run_tool(compile_cli.main, "--config=configs/tiny.py", *argv)
  assert status in (1, 2) and expected in one_line_error(err)


def test_a_machine_without_libtpu_is_told_how_to_install_it(monkeypatch):
  monkeypatch.setattr(targets, "libtpu_installed", lambda: False)
  status, _, err = run_tool(compile_cli.main, "--config=configs/tiny.py", "--target=v5p-8")
  assert status == 1
  assert one_line_error(err) == ("compile: --target v5p-8 needs libtpu, the TPU compiler: pip "
                                 "install 'transformer_jax[tpu]'")


def test_the_targets_devices_are_the_slices_chips():
  for name, kind, chips in [("v5p-8", "TPU v5", 4), ("tpu-v6e-8", "TPU v6 lite", 8)]:
    target = targets.target(name)
    devices = targets.devices(target)
    assert (len(devices), devices[0].device_kind, target.num_chips) == (chips, kind, chips)
  two = targets.target("v5e-4", num_slices=2)
  assert len({d.slice_index for d in targets.devices(two)}) == 2
  # libtpu's quiet settings are gone after: TPU_WORKER_HOSTNAMES would make the next
  # `train` in this process start jax.distributed as on a TPU pod
  assert "TPU_WORKER_HOSTNAMES" not in os.environ and "TPU_HOST_BOUNDS" not in os.environ


def test_auto_choices_are_made_as_on_a_tpu():
  cfg = check.for_target(tiny_train_config(**{"model.dtype": "auto",
                                              "model.attention_impl": "auto"}))
  assert (cfg.model.dtype, cfg.model.attention_impl) == ("bfloat16", "softmax_once")
  kept = check.for_target(tiny_train_config(**{"model.attention_impl": "einsum"}))
  assert (kept.model.dtype, kept.model.attention_impl) == ("float32", "einsum")
  assert jax.default_backend() == "cpu"  # (describing TPU devices started no TPU backend)
