"""How a beam's hypotheses keep their self-attention caches (`config.decode.beam_impl`).

- "gather": each hypothesis has its own cache, reordered every step to its parent's (two
  gathers per layer and step: `reorder`).
- "flat" (Praxis' flat_beam_search): a sentence's W hypotheses share one append-only cache,
  step i's keys/values at slots i * W + w (hypothesis w's), and none is ever reordered; which
  slots a hypothesis attends to is its ancestry, its ancestors' slots, a (B, W, W * C) mask
  that a step reorders instead of the caches (`reads`; the model reads a cache its rows share
  through such a mask: `model.stepwise`).

The outputs are the same (bit-equal tokens in f32, tested; in bf16 a product of other shapes
rounds differently). "auto" is flat (`shares_caches`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def shares_caches(beam_impl: str) -> bool:
  """Whether beam search runs flat for `beam_impl`: "flat" and "auto". Flat removes the
  loop's gathers and casts of the caches, for products of W queries over W times the keys:
  the faster search on the CPUs and the GPU measured and on the TPUs the compile tool
  predicts, in less memory (the figures: BENCHMARKS.md, "Flat beam search: caches never
  reordered" and "Flat beam search on CPUs too")."""
  return beam_impl in ("flat", "auto")


def reads(ancestry_BWS, steps_B):
  """The slots each hypothesis reads at its sentence's step (`steps_B`, (B,)): its ancestry
  and its own new slot."""
  W, slots = ancestry_BWS.shape[1:]
  own_BWS = jnp.arange(slots)[None, None, :] == (
      steps_B[:, None, None] * W + jnp.arange(W)[None, :, None])
  return ancestry_BWS | own_BWS


def reorder(cache, cache_axes: tuple, beam_indices_BW, batch_size):
  """Picks, for each sentence, the beams `beam_indices_BW` from every array of `cache` whose
  rows are hypotheses (B*W, ...), as its description (`cache_axes`, in leaf order) says; one
  row per sentence (the encoder's keys/values, shared by its beams) is left as it is."""
  def gather(x, axes):
    if axes.per_source:
      return x
    x = jnp.moveaxis(x, axes.rows, 0)
    x = x.reshape((batch_size, -1) + x.shape[1:])
    idx = beam_indices_BW.reshape(beam_indices_BW.shape + (1,) * (x.ndim - 2))
    taken = jnp.take_along_axis(x, idx, axis=1)
    return jnp.moveaxis(taken.reshape((-1,) + taken.shape[2:]), 0, axes.rows)
  leaves, tree = jax.tree_util.tree_flatten(cache)
  return tree.unflatten([gather(x, axes) for x, axes in zip(leaves, cache_axes)])
