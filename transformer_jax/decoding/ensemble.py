"""The models a search decodes with, made ready once for every batch of a set: one model or an
ensemble (tuples of models and of their parameters, one vocabulary), each member in the
per-layer layout, its projection kernels cast to the matmuls' dtype."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from transformer_jax.model.embeddings import compute_dtype
from transformer_jax.model.transformer import unscanned
from transformer_jax.parallel.program_store import stored_jit


@stored_jit(static_argnames=("dtype",))
def _in_compute_dtype(params, *, dtype):
  """The projection kernels cast once to the matmuls' dtype, not at every step; the rest
  (norms, biases, the embedding table, read in f32) as they are."""
  def cast(path, x):
    return x.astype(dtype) if getattr(path[-1], "key", None) == "kernel" else x
  return jax.tree_util.tree_map_with_path(cast, params)


@dataclasses.dataclass(frozen=True)
class Members:
  """One model or an ensemble made ready to decode (`prepare`): each member in the per-layer
  layout, its kernels in the compute dtype."""
  models: tuple
  params: tuple


def prepare(model, params=None) -> Members:
  """The members of one model or an ensemble (tuples of models and of their parameters), made
  ready once for every batch a set is decoded in; a Members is returned as it is."""
  if isinstance(model, Members):
    return model
  if not isinstance(model, tuple):
    model, params = (model,), (params,)
  pairs = [unscanned(m, p) for m, p in zip(model, params)]
  models = tuple(m for m, _ in pairs)
  params = tuple(p if compute_dtype(m.config) == jnp.float32
                 else _in_compute_dtype(p, dtype=compute_dtype(m.config))
                 for m, (_, p) in zip(models, pairs))
  return Members(models, params)
