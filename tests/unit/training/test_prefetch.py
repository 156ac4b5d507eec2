"""Device prefetch: the same batches in order, read ahead in a thread, a state that is the
position after the last batch handed out, errors raised in the consumer."""

import json

import grain
import pytest

from transformer_jax.training.prefetch import DevicePrefetch


def _iterator(n=20):
  return iter(grain.MapDataset.range(n).to_iter_dataset())


def test_batches_in_order_with_the_state_of_the_last_one_handed_out():
  prefetch = DevicePrefetch(_iterator(), lambda x: x * 10, depth=3)
  assert [next(prefetch) for _ in range(4)] == [0, 10, 20, 30]
  state = prefetch.get_state()  # (the thread has read ahead by now, or will)
  rest = [next(prefetch) for _ in range(3)]
  again = DevicePrefetch(_iterator(), lambda x: x * 10)
  again.set_state(state)
  assert [next(again) for _ in range(3)] == rest == [40, 50, 60]
  assert json.loads(again.get_state()) != json.loads(state)  # (moved on by 3 batches)
  prefetch.close()
  again.close()


def test_close_rewinds_to_the_batch_after_the_last_handed_out():
  it = _iterator()
  prefetch = DevicePrefetch(it, lambda x: x, depth=4)
  next(prefetch), next(prefetch)
  prefetch.close()
  assert next(it) == 2


def test_errors_of_the_thread_are_raised_by_next():
  def prepare(x):
    if x == 2:
      raise ValueError("bad batch 2")
    return x
  prefetch = DevicePrefetch(_iterator(), prepare)
  assert next(prefetch) == 0 and next(prefetch) == 1
  with pytest.raises(ValueError, match="bad batch 2"):
    next(prefetch)
