"""The shapes a search runs through: fewer rows as sentences finish, a longer cache as steps go.

A search state is a pytree whose arrays hold one row per sentence (B, ...) or per hypothesis
(B * W, ..., each sentence's W hypotheses consecutive), plus scalars (the step). Two jitted
functions change its shape between runs of the compiled search loop:

- `compact` keeps the rows of the sentences still searching (and, to fill a size of the
  ladder, some finished ones, which stay finished): work per step follows the live sentences;
- `grow` lengthens the caches (along the axis the model's description of its cache names)
  and the token buffers by `SEGMENT` positions: a step attends over, and reorders, the
  filled part (rounded up to a segment) instead of a cache allocated at the longest possible
  output.

Each (rows, length) pair is one compiled program per batch shape; the ladders keep them few
(a batch starts at its size or a smaller power of two and compacts into powers of four and
FEWEST_ROWS; lengths are multiples of SEGMENT), and the program store
(`parallel.program_store`) keeps them, compiled, across processes. The ladders trade the
first decode's compiling against the warm speed: compacting by fours with 16-position
segments runs faster warm than by twos with 32 positions (a shorter cache is copied and
attended over with fewer empty positions), for about as much compiling (fewer sizes, more
lengths; the figures: BENCHMARKS.md, "Fewer, cheaper shapes").
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.parallel.program_store import stored_jit

SEGMENT = 16  # cache positions (and token slots) added at a time
FEWEST_ROWS = 8  # a search is not compacted below this many rows (each size is more programs)


COMPACTION_RATIO = 4  # a search's sizes: its first, then powers of four (and FEWEST_ROWS)


def row_sizes(batch_rows: int, unit: int = 1, ratio: int = 2) -> list[int]:
  """Batch sizes, largest first: `batch_rows`, the powers of `ratio` below it (2: the sizes a
  batch may start at; COMPACTION_RATIO: those a search compacts into) and FEWEST_ROWS, each
  rounded up to a multiple of `unit` (the mesh's data-parallel size)."""
  smaller, power = {FEWEST_ROWS}, 1
  while power < batch_rows:
    smaller.add(power)
    power *= ratio
  sizes = {batch_rows} | {-(-s // unit) * unit for s in smaller}
  return sorted((s for s in sizes if s <= batch_rows), reverse=True)


def fitting_size(rows: int, sizes: list[int]) -> int:
  """The smallest of `sizes` (largest first) that holds `rows` rows."""
  return min(s for s in sizes if s >= rows)


def compacted_size(live: int, sizes: list[int]) -> int:
  """The size a search compacts `live` sentences into: the smallest that holds them, not
  below FEWEST_ROWS."""
  return fitting_size(max(live, FEWEST_ROWS), sizes)


def smaller_size(rows: int, sizes: list[int]) -> int:
  """The largest size below `rows`, not below FEWEST_ROWS (0 if none): a search at `rows`
  rows stops to compact once no more than that many sentences are left."""
  return max((s for s in sizes if FEWEST_ROWS <= s < rows), default=0)


def segments(length: int) -> int:
  """`length` rounded up to whole segments."""
  return SEGMENT * max(1, -(-length // SEGMENT))


def _take_rows(x, keep, rows: int, axis: int | None = 0):
  """`x` with the rows of the sentences `keep` along `axis` (None: one value for all)."""
  if x.ndim == 0 or axis is None:
    return x
  x = jnp.moveaxis(x, axis, 0)
  per_sentence = x.shape[0] // rows  # 1 (a sentence's row) or W (its hypotheses)
  x = x.reshape((rows, per_sentence) + x.shape[1:])
  x = jnp.take(x, keep, axis=0)
  return jnp.moveaxis(x.reshape((-1,) + x.shape[2:]), 0, axis)


@stored_jit(static_argnames=("rows",))
def compact(state, keep, *, rows: int):
  """The state of the sentences `keep` (indices into the current `rows` sentences), in that
  order: the cache's arrays along the rows their description names, the rest along their
  first axis."""
  cache = map_cache(lambda x, axes: _take_rows(x, keep, rows, axes.rows), state.cache,
                    state.cache_axes)
  rest = jax.tree_util.tree_map(lambda x: _take_rows(x, keep, rows), state.replace(cache=()))
  return rest.replace(cache=cache)


def map_cache(fn, cache, cache_axes: tuple):
  """`cache` with each array x replaced by fn(x, its `CacheAxes`) (`cache_axes`: in the
  order of the cache's leaves)."""
  leaves, tree = jax.tree_util.tree_flatten(cache)
  return tree.unflatten([fn(x, axes) for x, axes in zip(leaves, cache_axes)])


def cache_axes(scorer, cache) -> tuple:
  """The model's description of each array of `cache` (`model.stepwise.CacheAxes`), in the
  order of the cache's leaves: static, kept in the search state beside the cache."""
  return tuple(jax.tree_util.tree_leaves(scorer.cache_axes(cache)))


def _grown(x, axis: int | None, capacity: int, length: int):
  """`x` padded with zeros along `axis` from `capacity` positions to `length` (the axis may
  hold several slots per position: a cache its rows share)."""
  if axis is None:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, length * (x.shape[axis] // capacity) - x.shape[axis])
  return jnp.pad(x, widths)


@stored_jit(static_argnames=("length",))
def grow(state, *, length: int):
  """The state with its caches' positions (as their description says) and the token buffers
  its class names (`grown`: their last axis) padded with zeros to `length` positions."""
  cache = map_cache(lambda x, axes: _grown(x, axes.length, state.capacity, length),
                    state.cache, state.cache_axes)
  buffers = {name: getattr(state, name) for name in state.grown}
  return state.replace(cache=cache, **{
      name: None if x is None else _grown(x, -1, state.capacity, length)
      for name, x in buffers.items()})


def store_rows(out: np.ndarray, rows: np.ndarray, values: np.ndarray):
  """`out[rows] = values` along a last axis that may be longer or shorter in `values` (its
  positions past `out`'s length are 0: no row's cap reaches them)."""
  width = min(out.shape[-1], values.shape[-1])
  out[rows, ..., :width] = values[..., :width]
