"""grain worker processes packing pre-tokenized batches (config.data.num_workers): the same
batches in every run with that worker count, only kept pairs, exact counts, resume."""

import dataclasses

import numpy as np

from tests import helpers
from tests.helpers import SRC, TGT
from transformer_jax.data import pipeline as data
from transformer_jax.data.plan import data_plan


def test_worker_processes_make_deterministic_batches_that_resume(tmp_path):
  """num_workers=2: grain worker processes pack; the batches are the same in every run with
  that worker count, hold only kept pairs, and a saved state resumes at the next batch."""
  cfg, tok = helpers.small_corpus(tmp_path)
  cfg = dataclasses.replace(cfg, num_workers=2)
  pairs = {(tuple(tok.encode(s)), tuple(tok.encode(t))) for s, t in zip(SRC, TGT)}
  kept = {p for p in pairs if len(p[0]) <= 16 and len(p[1]) <= 16}

  def batches(state=None, n=6):
    pipe = data.train_pipeline(data_plan(cfg), tok, seed=2)
    it = iter(pipe.dataset)
    if state is not None:
      it.set_state(state)
    out = [pipe.take_stats(next(it)) for _ in range(n)]
    state = it.get_state()
    it.close()
    return out, state, pipe

  first, state, pipe = batches()
  again, _, _ = batches()
  for a, b in zip(first, again):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
  assert {p for b in first for p in helpers.unpack_batch(b)} <= kept
  assert pipe.filter.kept == sum(len(helpers.unpack_batch(b)) for b in first)
  assert pipe.filter.too_long > 0
  following, _, _ = batches(n=9)
  resumed, _, _ = batches(state, n=3)
  for a, b in zip(following[6:], resumed):
    for k in a:
      np.testing.assert_array_equal(a[k], b[k])
