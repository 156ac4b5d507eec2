"""What a search decodes with, made ready once for every batch of a set (`prepare`): one model
(`model.stepwise.StepwiseModel`) or an ensemble of several (`Ensemble`, the same interface;
one vocabulary), each model in the per-layer layout, its projection kernels cast to the
matmuls' dtype."""

from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from transformer_jax.model.embeddings import compute_dtype, prepared_output
from transformer_jax.model.stepwise import StepwiseModel
from transformer_jax.model.transformer import unscanned
from transformer_jax.parallel.program_store import stored_jit


@flax.struct.dataclass
class Ensemble:
  """Several models decoding as one: each step's log-probabilities are their average; the
  cache is a tuple of theirs."""
  models: tuple  # StepwiseModels

  @property
  def max_len(self) -> int:
    return min(m.max_len for m in self.models)  # (every model's positions)

  def new_cache(self, inputs_BS, rows_per_source: int, length: int, shared: bool = False):
    return tuple(m.new_cache(inputs_BS, rows_per_source, length, shared) for m in self.models)

  def step(self, cache, inputs_BS, tokens_N, positions_N, readable_BRS=None, adjust=None):
    log_probs, caches = zip(*(m.step(c, inputs_BS, tokens_N, positions_N, readable_BRS, adjust)
                              for m, c in zip(self.models, cache)))
    return sum(log_probs[1:], log_probs[0]) / len(log_probs), tuple(caches)

  def cache_axes(self, cache):
    return tuple(m.cache_axes(c) for m, c in zip(self.models, cache))


def in_compute_dtype(params, *, dtype):
  """The projection kernels cast to the matmuls' dtype (once, not at every step); the rest
  (norms, biases, the embedding table, read in f32) as they are. Traceable: the compile tool
  casts abstract parameters with it (`jax.eval_shape`)."""
  def cast(path, x):
    return x.astype(dtype) if getattr(path[-1], "key", None) == "kernel" else x
  return jax.tree_util.tree_map_with_path(cast, params)


def decoding_variables(params, *, dtype):
  """(the parameters with their kernels in the compute dtype, what a step reads beside them:
  `embeddings.prepared_output`). Traceable: the compile tool makes them abstract."""
  cast = params if dtype == jnp.float32 else in_compute_dtype(params, dtype=dtype)
  return cast, prepared_output(params, dtype)


_decoding_variables = stored_jit(static_argnames=("dtype",))(decoding_variables)


def _stepwise(model, params) -> StepwiseModel:
  model, params = unscanned(model, params)
  params, prepared = _decoding_variables(params, dtype=jnp.dtype(compute_dtype(model.config)))
  return StepwiseModel(model, params, prepared)


def prepare(model, params=None):
  """One model (a Transformer and its parameters) or an ensemble (tuples of both) made ready
  to decode: a StepwiseModel or an Ensemble; one made ready already is returned as it is."""
  if isinstance(model, (StepwiseModel, Ensemble)):
    return model
  if not isinstance(model, tuple):
    return _stepwise(model, params)
  if len(model) == 1:
    return _stepwise(model[0], params[0])
  return Ensemble(tuple(_stepwise(m, p) for m, p in zip(model, params)))
