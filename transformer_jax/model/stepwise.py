"""The model's decoding interface: what a search needs of a Transformer, and nothing of how it
searches (`decoding.search` imports no model; it takes this interface, or an ensemble of it).

- `new_cache`: the sources encoded, and a cache for R decoder rows per source (R = 1: one
  row each), C positions long; `shared=True`: the R rows of a source share one self-attention
  cache, a step writing R slots (row r's at step i: slot i * R + r), which each row reads
  through its own mask (`step`'s `readable_BRS`) instead of the cache being moved;
- `step`: each row's log-probabilities of its next token after `tokens_N`, its
  `positions_N`-th (rows decode at positions of their own: the cache keeps no step counter),
  and the cache with this step's keys/values in it (`adjust`: a function that rewrites the
  logits before their log-softmax, e.g. the search's rules on repeated tokens);
- `cache_axes`: what each array of a cache holds along its axes (`CacheAxes`), so that code
  outside the model inserts sources into, resizes and reorders caches without knowing their
  variable names.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp

from transformer_jax.model.transformer import Transformer
from transformer_jax.ops.platform import traced_for


@dataclasses.dataclass(frozen=True)
class CacheAxes:
  """What a cache array holds along its axes."""
  rows: int          # the axis of rows
  per_source: bool   # its rows are sources (the encoder's keys/values), not decoder rows
  length: int | None  # the axis of decoded positions (their slots); None: none
  source: int | None  # the axis of source positions; None: none


def _name(key) -> str:
  return str(getattr(key, "key", getattr(key, "name", getattr(key, "idx", ""))))


def cache_axes(cache):
  """The `CacheAxes` of each array of a Transformer's decoding cache (the same tree)."""
  def describe(path, x):
    names = [_name(k) for k in path]
    if names[-1] in ("cached_key", "cached_value"):  # (B, H, C or S, K)
      cross = "cross_attention" in names
      return CacheAxes(0, cross, None if cross else 2, 2 if cross else None)
    raise ValueError(f"no description of the decoding cache's {'/'.join(names)}")
  return jax.tree_util.tree_map_with_path(describe, cache)


def _shared(cache, rows_per_source: int):
  """A cache made for one row per source, its self-attention keys/values widened to slots
  for `rows_per_source` rows: (B, H, C, K) -> (B, H, R * C, K), empty as made."""
  def widen(x, axes: CacheAxes):
    if axes.length is None:
      return x
    shape = list(x.shape)
    shape[axes.length] *= rows_per_source
    return jnp.zeros(shape, x.dtype)
  return jax.tree_util.tree_map(widen, cache, cache_axes(cache))


def _log_softmax(logits_NV):
  """jax.nn.log_softmax over the last axis, the same values. On a CPU the maximum is taken
  over a copy with the first column out (and that column's after): XLA:CPU would otherwise
  fuse the output layer's product into the maximum, one fusion three times slower than the
  two apart (docs/design/decoding.md); the copy stops it."""
  if traced_for() != "cpu":
    return jax.nn.log_softmax(logits_NV)
  rest_NV = logits_NV.at[:, 0].set(-jnp.inf)
  max_N1 = jnp.maximum(jnp.max(rest_NV, axis=-1, keepdims=True), logits_NV[:, :1])
  shifted_NV = logits_NV - jax.lax.stop_gradient(max_N1)
  return shifted_NV - jnp.log(jnp.sum(jnp.exp(shifted_NV), axis=-1, keepdims=True))


@flax.struct.dataclass
class StepwiseModel:
  """A Transformer in the per-layer layout and its parameters, as a search decodes with it."""
  model: Transformer = flax.struct.field(pytree_node=False)
  params: Any
  prepared: Any = None  # what a step reads beside the parameters (`embeddings.prepared_output`)

  @property
  def max_len(self) -> int:
    """The longest source and translation its positions allow."""
    return self.model.config.max_len

  def new_cache(self, inputs_BS, rows_per_source: int, length: int, shared: bool = False):
    """The sources `inputs_BS` encoded, and a cache of `length` positions for
    `rows_per_source` decoder rows of each (consecutive), shared by them or not."""
    variables = {"params": self.params}
    encoded_BSD = self.model.apply(variables, inputs_BS, method=Transformer.encode)
    _, mutated = self.model.apply(variables, encoded_BSD, inputs_BS, length,
                                  1 if shared else rows_per_source,
                                  method=Transformer.init_cache, mutable=["cache"])
    cache = mutated["cache"]
    return _shared(cache, rows_per_source) if shared else cache

  def step(self, cache, inputs_BS, tokens_N, positions_N, readable_BRS=None, adjust=None):
    """(log-probabilities (N, V) in f32 of each row's next token after `tokens_N`, the
    cache); `positions_N`: each row's position (the tokens it has so far; the rows sharing
    a cache at one); `inputs_BS`: the sources (their padding is masked); `readable_BRS`:
    with a shared cache, the slots each of a source's R rows reads; `adjust`: logits
    (N, V) -> logits, applied before the log-softmax."""
    # (the encoder's output is in the cache already, as cross-attention keys/values)
    variables = {"params": self.params, "cache": cache}
    if self.prepared is not None:
      variables["prepared"] = self.prepared
    logits, mutated = self.model.apply(
        variables, None, inputs_BS, tokens_N[:, None],
        targets_positions_BT=positions_N[:, None], cached=True,
        method=Transformer.decoder_logits, mutable=["cache"], readable_BRS=readable_BRS)
    logits_NV = logits[:, 0].astype(jnp.float32)
    if adjust is not None:
      logits_NV = adjust(logits_NV)
    return _log_softmax(logits_NV), mutated["cache"]

  @staticmethod
  def cache_axes(cache):
    return cache_axes(cache)
