"""The train step and beam search lowered for CUDA GPUs on this CPU machine (jax.export): a
lowering only a GPU would reject fails here."""

import jax

from tests.helpers import ONE_LAYER, tiny_train_config
from transformer_jax.aot import cuda
from transformer_jax.parallel import mesh as mesh_lib


def test_the_train_step_and_beam_search_lower_for_cuda():
  cfg = tiny_train_config(**ONE_LAYER, **{"model.dtype": "auto", "model.attention_impl": "auto"})
  mesh = mesh_lib.make_mesh(cfg.parallelism, jax.devices()[:1])
  programs = cuda.exported(cfg, mesh)
  assert sorted(programs) == ["beam_advance", "train_step"]
  for exported in programs.values():
    assert exported.platforms == ("cuda",)
  text = programs["train_step"].mlir_module()
  assert "bf16" in text  # the dtype a GPU of compute capability >= 8.0 gets for "auto"
  assert "stablehlo.while" in programs["beam_advance"].mlir_module()


def test_auto_attention_is_lowered_with_xlas_implementation():
  cfg = cuda.for_gpu(tiny_train_config(**{"model.attention_impl": "auto",
                                          "model.dtype": "auto"}), capability="7.0")
  assert (cfg.model.attention_impl, cfg.model.dtype) == ("xla", "float32")
