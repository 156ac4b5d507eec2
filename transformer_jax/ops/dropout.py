"""Inverted dropout from a counter-based generator: a few integer operations per element, fused
into the dropout itself (drawing threefry bits per element was most of dropout's cost on CPU)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config.population import is_static


class Dropout(nn.Module):
  """Inverted dropout: zeroes each element with probability `rate`, scales the rest by
  1 / (1 - rate).

  The keep decisions come from a counter-based generator: each element's index, mixed with
  two 32-bit seeds drawn from the 'dropout' key by two rounds of the murmur3 finalizer (an
  invertible avalanche mix). It costs a few integer operations per element, fused into the
  dropout itself, where drawing threefry bits per element was most of dropout's cost on CPU
  (a faster training step than 16-bit threefry draws or flax's nn.Dropout: BENCHMARKS.md,
  "Against the PyTorch peer"). The rate is exact to 2^-32; a traced rate (a population
  member's, in f32) to about 2^-24.
  """
  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or (is_static(self.rate) and self.rate == 0.0):
      return x
    seeds = jax.random.bits(self.make_rng("dropout"), (2,), jnp.uint32)
    bits = _fmix32(_fmix32(_element_index(x.shape) ^ seeds[0]) + seeds[1])
    if is_static(self.rate):
      threshold = np.uint32(min(round(self.rate * 2.0 ** 32), 2 ** 32 - 1))
      kept = 1.0 - self.rate
    else:  # (the largest float32 under 2^32: the conversion stays in uint32's range)
      threshold = jnp.clip(jnp.round(self.rate * 2.0 ** 32), 0.0, 4294967040.0).astype(
          jnp.uint32)
      kept = (1.0 - self.rate).astype(x.dtype)
    return jnp.where(bits >= threshold, x / kept, jnp.zeros_like(x))


def _element_index(shape):
  """Each element's row-major index (mod 2^32), as uint32."""
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(len(shape))):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * np.uint32(stride % 2**32)
    stride *= shape[axis]
  return index


def _fmix32(h):
  """murmur3's 32-bit finalizer: a bijection in which every input bit flips about half of
  the output bits."""
  h = h ^ (h >> 16)
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> 16)

