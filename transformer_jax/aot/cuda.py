"""A run's programs lowered for CUDA GPUs without one (`jax.export` takes a platform the
machine lacks): a lowering that only a GPU would reject is caught on any machine. Lowering is
not compiling: what XLA's GPU compiler makes of the programs is not checked here.

`config.model.attention_impl="auto"` is lowered as "xla" (jax.nn.dot_product_attention's XLA
implementation): cuDNN's, what `auto` picks on a GPU, checks for the cuDNN library while it
traces and refuses without a GPU ("cuDNN is not detected")."""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import export

from transformer_jax.aot import programs
from transformer_jax.config.sections import TrainConfig
from transformer_jax.decoding.engine import SearchEngine
from transformer_jax.model.transformer import Transformer
from transformer_jax.ops.platform import tracing_for
from transformer_jax.parallel import numerics
from transformer_jax.training.state import abstract_state
from transformer_jax.training.step import train_step

PLATFORM = "cuda"


def for_gpu(cfg: TrainConfig, capability: str = "9.0") -> TrainConfig:
  """`cfg` with "auto" choices made as on a GPU of that compute capability (dtype) and as
  lowering without one allows (attention)."""
  model = cfg.model
  if model.dtype == "auto":
    model = dataclasses.replace(model, dtype=numerics.accelerator_choice("gpu", capability).dtype)
  if model.attention_impl == "auto":
    model = dataclasses.replace(model, attention_impl="xla")
  return dataclasses.replace(cfg, model=model)


def _unsharded(tree):
  return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def exported(cfg: TrainConfig, mesh) -> dict[str, export.Exported]:
  """The train step and beam search's in-flight advance exported for CUDA (one device; `mesh`:
  a one-device mesh of this machine, to describe the state), traced for a GPU."""
  with tracing_for("gpu"):
    return _exported(for_gpu(cfg), mesh)


def _exported(cfg: TrainConfig, mesh) -> dict[str, export.Exported]:
  model = Transformer(cfg.model)
  state = _unsharded(abstract_state(cfg, model, mesh))
  rows, S, T = cfg.data.batch_size, cfg.data.max_source_length, cfg.data.max_target_length
  batch = {key: jax.ShapeDtypeStruct((rows, T if key.startswith("targets") else S), jnp.int32)
           for key in programs.TRAIN_KEYS}
  step = jax.jit(functools.partial(train_step, model=model, label_smoothing=cfg.label_smoothing,
                                   num_micro_batches=cfg.num_micro_batches))
  out = {"train_step": export.export(step, platforms=[PLATFORM])(
      state, batch, jax.ShapeDtypeStruct((2,), jnp.uint32))}

  scorer = programs.decoding_model(cfg, mesh)
  scorer = scorer.replace(params=_unsharded(scorer.params), prepared=_unsharded(scorer.prepared))
  # (a server's advance: every option lowered, the rules and sampling included)
  advance, args = SearchEngine(scorer, None, cfg.decode).functions(server=True)
  out["beam_advance"] = export.export(jax.jit(advance), platforms=[PLATFORM])(*args)
  return out
