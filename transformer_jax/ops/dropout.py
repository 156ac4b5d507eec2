"""Inverted dropout from a counter-based generator: a few integer operations per element, fused
into the dropout itself (drawing threefry bits per element was most of dropout's cost on CPU)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from transformer_jax.config.population import is_static

# The dtypes dropout may scale (the model's activations and matmul inputs).
SCALED_DTYPES = ("float32", "bfloat16", "float16")


def keep_threshold(rate: float) -> np.uint32:
  """The 32-bit threshold of `rate`: an element is kept where its random bits are >= it."""
  return np.uint32(min(round(rate * 2.0 ** 32), 2 ** 32 - 1))


def kept_scale(rate: float, dtype) -> np.ndarray:
  """1 / (1 - rate) in `dtype`: 1 - rate rounded into it, then its reciprocal there (the number
  XLA multiplies by where a program divides by the constant 1 - rate)."""
  dtype = jnp.dtype(dtype)
  return np.asarray(1, dtype) / np.asarray(1.0 - rate, dtype)


class TracedRate(struct.PyTreeNode):
  """Rates known only as the program runs (a population's members': (K,) arrays, or one
  member's scalars), as the numbers Dropout takes from a static rate: its keep threshold and
  scale in each dtype. (A rate traced in float32 would round the threshold to 2^-24 of the
  rate, and XLA would divide by 1 - rate where a static rate has it multiply.)"""
  threshold: jax.Array  # uint32
  scale: dict  # dtype name -> 1 / (1 - rate) in that dtype

  @classmethod
  def of(cls, rates) -> TracedRate:
    rates = [float(r) for r in rates]
    return cls(np.asarray([keep_threshold(r) for r in rates]),
               {name: np.asarray([kept_scale(r, name) for r in rates])
                for name in SCALED_DTYPES})


class Dropout(nn.Module):
  """Inverted dropout: zeroes each element with probability `rate`, scales the rest by
  1 / (1 - rate).

  The keep decisions come from a counter-based generator: each element's index, mixed with
  two 32-bit seeds drawn from the 'dropout' key by two rounds of the murmur3 finalizer (an
  invertible avalanche mix). It costs a few integer operations per element, fused into the
  dropout itself, where drawing threefry bits per element was most of dropout's cost on CPU
  (a faster training step than 16-bit threefry draws or flax's nn.Dropout: BENCHMARKS.md,
  "Against the PyTorch peer"). The rate is exact to 2^-32. `rate` is a number, or a
  `TracedRate` (a population member's), which keeps and scales as its number does.
  """
  rate: float | TracedRate

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or (is_static(self.rate) and self.rate == 0.0):
      return x
    seeds = jax.random.bits(self.make_rng("dropout"), (2,), jnp.uint32)
    bits = _fmix32(_fmix32(_element_index(x.shape) ^ seeds[0]) + seeds[1])
    if is_static(self.rate):
      threshold, scale = keep_threshold(self.rate), kept_scale(self.rate, x.dtype)
    else:
      threshold, scale = self.rate.threshold, self.rate.scale[jnp.dtype(x.dtype).name]
    return jnp.where(bits >= threshold, x * scale, jnp.zeros_like(x))


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

