"""Fully sharded data parallelism (FSDP) made explicit: each device computes a loss over its
own rows with the parameters gathered whole from their pieces, and the gradients come back
summed and scattered, each device receiving the sum of its own piece only (a reduce-scatter:
half the bytes of an all-reduce of the whole gradient, and no whole summed gradient held
anywhere).

Left to GSPMD (the parameters constrained whole for the forward pass, the gradients back to
their split), each gradient was summed whole and then sliced: XLA:CPU kept it so; the TPU
compiler made most of the pairs into its reduce-scatter (a fusion), but not the tied
embedding table's, which the fused loss's own `shard_map` summed whole, nor on v5e the
default config's output projections. Here the sum is the transpose of the gather inside a
`shard_map` over the batch axes: a reduce-scatter on every backend for every split matrix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

FSDP_AXIS = "fsdp"


def _axes(entry) -> tuple[str, ...]:
  return (entry,) if isinstance(entry, str) else tuple(entry or ())


def split_dimension(sharding: NamedSharding) -> int | None:
  """The dimension of a parameter that `fsdp` splits (None: it is kept whole on each device,
  and its gradient is summed whole: the norms' scales, biases not on the model dimension)."""
  for dim, entry in enumerate(sharding.spec):
    if FSDP_AXIS in _axes(entry):
      return dim
  return None


def _manual_spec(sharding: NamedSharding, manual: tuple[str, ...]) -> P:
  """The parameter's spec over the `shard_map`'s manual axes only (`tensor` stays GSPMD's)."""
  def keep(entry):
    kept = tuple(a for a in _axes(entry) if a in manual)
    return kept[0] if len(kept) == 1 else (kept or None)
  return P(*(keep(entry) for entry in sharding.spec))


def gathered(piece, dim: int):
  """The whole parameter from each device's `piece` of it, split on `dim` over `fsdp`. The
  pieces are stacked on a new leading axis and then laid in place, so that the transpose (the
  gradient's reduce-scatter) scatters over that leading axis: a tiled gather along `dim`
  transposes to a scatter along `dim`, which the TPU compiler turns back into an all-reduce
  where `dim` is the array's minor one (the output projection's, the embedding table's)."""
  pieces = jax.lax.all_gather(piece, FSDP_AXIS, axis=0)           # (n, ..., d/n, ...)
  pieces = jnp.moveaxis(pieces, 0, dim)                            # (..., n, d/n, ...)
  return pieces.reshape(piece.shape[:dim] + (-1,) + piece.shape[dim + 1:])


def loss_sums_per_device(loss_sums, params, batch, rngs, param_shardings, batch_axes):
  """`loss_sums(params, batch, rngs)` (a tuple of scalar sums) computed by each device for
  its own rows of `batch` (split over `batch_axes`) with the parameters gathered whole, the
  sums added over the devices. Its gradient with respect to `params` is split as
  `param_shardings` (the gather's transpose: reduce-scatter over `fsdp`, then a sum over the
  other batch axes of each piece).

  Each device draws its own dropout masks (`rngs` folded with its index): masks differ from
  one device's for the same batch, as any two meshes that split the rows differently draw
  them; without dropout the step is the one-device step (tested)."""
  mesh = jax.tree_util.tree_leaves(param_shardings)[0].mesh
  manual = tuple(a for a in batch_axes if mesh.shape[a] > 1)
  specs = jax.tree_util.tree_map(lambda s: _manual_spec(s, manual), param_shardings)
  dims = jax.tree_util.tree_map(split_dimension, param_shardings)

  def local(params, batch, rngs):
    index = jax.lax.axis_index(manual)
    rngs = {name: jax.random.fold_in(key, index) for name, key in rngs.items()}
    params = jax.tree_util.tree_map(
        lambda piece, dim: piece if dim is None else gathered(piece, dim), params, dims)
    return tuple(jax.lax.psum(x, manual) for x in loss_sums(params, batch, rngs))

  # (check_vma=False: the fused output loss carries each device's own table gradient through
  # a scan, whose carry's type must not change; the transposes are then the plain ones: the
  # gather's a reduce-scatter, a replicated input's a sum over the devices; tested)
  return jax.shard_map(local, mesh=mesh, in_specs=(specs, P(manual), P()),
                       out_specs=P(), axis_names=set(manual),
                       check_vma=False)(params, batch, rngs)
