"""First-fit packing of pre-tokenized chunks: every pair once, in rows it fits, batches that end
only when the next pair fits no row, counts of filtered pairs, exact resume mid-chunk."""

import grain
import numpy as np

from tests import helpers
from transformer_jax.data import packing, tokenized

ROWS, LENGTHS = 3, (10, 8)


def _pairs(n=60, seed=0):
  """Synthetic pairs (ids 1..) with a filter code each: every 7th is marked too long."""
  rng = np.random.default_rng(seed)
  pairs = []
  for i in range(n):
    src = tuple(rng.integers(3, 50, rng.integers(2, 9)).tolist())
    tgt = tuple(rng.integers(3, 50, rng.integers(2, 7)).tolist())
    pairs.append((src, tgt, tokenized.TOO_LONG if i % 7 == 3 else tokenized.KEEP))
  return pairs


def _chunks(pairs, size=4):
  """A grain dataset of chunks of `size` consecutive pairs (so batches span chunks)."""
  def make(c):
    part = pairs[c * size:(c + 1) * size]
    kept = [p for p in part if p[2] == tokenized.KEEP]
    side = lambda j: (np.asarray([t for p in kept for t in p[j]], np.int32),  # noqa: E731
                      np.asarray([len(p[j]) for p in kept], np.int64))
    return packing.chunk(np.asarray([p[2] for p in part], np.int8), side(0), side(1))
  return grain.MapDataset.range(len(pairs) // size).map(make).to_iter_dataset()


def _batches(it, n):
  return [next(it) for _ in range(n)]


def test_every_kept_pair_once_in_order_of_rows_with_counts():
  pairs = _pairs()
  it = iter(packing.PackedBatches(_chunks(pairs), ROWS, LENGTHS))
  seen, stats = [], np.zeros(3, np.int64)
  batches = _batches(it, 8)
  for b in batches:
    assert b["inputs"].shape == (ROWS, 10) and b["targets"].shape == (ROWS, 8)
    assert all(b[k].dtype == np.int32 for k in b if k not in packing.STATS_KEYS)
    stats += [int(b[k]) for k in packing.STATS_KEYS]
    seen += helpers.unpack_batch(b)
  kept = [(p[0], p[1]) for p in pairs if p[2] == tokenized.KEEP]
  assert sorted(seen) == sorted(kept[:len(seen)])  # the stream's first pairs, each once
  taken = [p for p in pairs][:len(seen) + int(stats[2])]
  assert stats[0] == len(seen) and stats[2] == sum(p[2] == tokenized.TOO_LONG for p in taken)


def test_a_batch_ends_only_when_the_next_pair_fits_no_row():
  it = iter(packing.PackedBatches(_chunks(_pairs(seed=1)), ROWS, LENGTHS))
  batches = _batches(it, 9)
  for b, following in zip(batches, batches[1:]):
    free_src = LENGTHS[0] - (b["inputs_segment_ids"] > 0).sum(1)
    free_tgt = LENGTHS[1] - (b["targets_segment_ids"] > 0).sum(1)
    # First fit in stream order: the next batch's first pair is row 0's first segment.
    n_src = int((following["inputs_segment_ids"][0] == 1).sum())
    n_tgt = int((following["targets_segment_ids"][0] == 1).sum())
    assert not np.any((free_src >= n_src) & (free_tgt >= n_tgt))


def test_state_restores_mid_chunk_to_the_same_batches():
  pairs = _pairs(seed=2)
  it = iter(packing.PackedBatches(_chunks(pairs), ROWS, LENGTHS))
  _batches(it, 3)
  state = it.get_state()
  assert state["position"] not in (0, 4)  # (inside a chunk)
  expected = _batches(it, 4)
  it2 = iter(packing.PackedBatches(_chunks(pairs), ROWS, LENGTHS))
  it2.set_state(state)
  for want, got in zip(expected, _batches(it2, 4)):
    for k in want:
      np.testing.assert_array_equal(got[k], want[k])
