"""Decoding whole sets: a sentence's translation does not depend on the batch it is in."""

import collections
import dataclasses
import types

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax import monitoring

from tests import helpers
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.decoding import resizing
from transformer_jax.decoding import search as search_lib
from transformer_jax.decoding.batches import decode_batches, sentence_caps, translate_nbest
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import program_store

# 32 source lengths from 1 to 40 tokens: a batch of them spans three 16-token buckets; their
# caps (length + 2) end the short ones early, so that the search compacts 32 -> 16 -> 8 rows,
# and the long ones pass the cache's first segment (16 positions), so that it grows.
LENGTHS = tuple(1 + i * 39 // 31 for i in range(32))


def _eval_set(ids):
  return EvalSet([""] * len(ids), [""] * len(ids), list(ids), [np.array([1])] * len(ids))


@pytest.fixture(scope="module")
def random_model():
  cfg = helpers.section("model", vocab_size=16, d_model=16, num_heads=2, d_ff=32,
                        num_encoder_layers=1, num_decoder_layers=1, dropout_rate=0.0,
                        max_len=64, dtype="float32")
  model = Transformer(cfg)
  rng = np.random.default_rng(0)
  sources = [rng.integers(3, 16, n).astype(np.int32) for n in LENGTHS]
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(3), sources[0][None],
                                             sources[0][None])["params"])
  return model, params, sources


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_a_translation_is_the_same_alone_and_in_a_batch(random_model, search, dtype):
  model, params, sources = random_model
  model = Transformer(dataclasses.replace(model.config, dtype=dtype))
  cfg = helpers.section("decode", beam_size=3, greedy=search == "greedy", max_length=64,
                        max_length_a=1.0, max_length_b=2, batch_size=len(sources))

  def decode(ids, counts=None):
    return {int(i): (s, c) for rows, seqs, scores in
            decode_batches(prepare(model, params), _eval_set(ids), cfg, counts=counts)
            for i, s, c in zip(rows, seqs, scores)}

  counts = collections.Counter()
  together = decode(sources, counts)
  assert counts["compactions"] >= 2 and counts["growths"] >= 1, counts
  for i, source in enumerate(sources):
    (alone_seqs, alone_scores), = decode([source]).values()
    seqs, scores = together[i]
    width = max(alone_seqs.shape[-1], seqs.shape[-1])
    pad = [(0, 0)] * (seqs.ndim - 1)
    np.testing.assert_array_equal(np.pad(alone_seqs, pad + [(0, width - alone_seqs.shape[-1])]),
                                  np.pad(seqs, pad + [(0, width - seqs.shape[-1])]))
    np.testing.assert_allclose(alone_scores, scores, rtol=1e-5 if dtype == "float32" else 2e-3)
    # ...and it ends by the sentence's own cap: len + 2 tokens.
    assert (seqs[0] > 0).sum() <= LENGTHS[i] + 2


def test_each_sentence_has_its_own_cap_and_an_empty_row_none():
  cfg = helpers.section("decode", max_length=20, max_length_a=1.5, max_length_b=3)
  inputs = np.array([[5, 6, 1, 0], [5, 6, 7, 1], [0, 0, 0, 0]])
  np.testing.assert_array_equal(sentence_caps(cfg, inputs, None, 64), [7, 9, 0])
  np.testing.assert_array_equal(sentence_caps(cfg, inputs, None, 8), [7, 8, 0])
  prefixes = np.array([[4, 4, 4, 4, 4, 4, 4, 4], [4, 0, 0, 0, 0, 0, 0, 0], [0] * 8])
  np.testing.assert_array_equal(sentence_caps(cfg, inputs, prefixes, 64), [9, 9, 0])


def test_the_batch_sizes_a_search_steps_down_through():
  assert resizing.row_sizes(128) == [128, 64, 32, 16, 8, 4, 2, 1]
  assert resizing.row_sizes(100) == [100, 64, 32, 16, 8, 4, 2, 1]
  assert resizing.row_sizes(16, unit=8) == [16, 8]
  assert resizing.row_sizes(24, unit=6) == [24, 18, 12, 6]
  # (a search compacts by fours: each size is a program per source width and cache length)
  assert resizing.row_sizes(128, ratio=4) == [128, 64, 16, 8, 4, 1]
  assert resizing.row_sizes(32, ratio=4) == [32, 16, 8, 4, 1]
  assert resizing.row_sizes(20, unit=8, ratio=4) == [20, 16, 8]  # (the batch's own size)
  sizes = resizing.row_sizes(100, ratio=4)
  assert sizes == [100, 64, 16, 8, 4, 1]
  assert resizing.fitting_size(65, sizes) == 100 and resizing.fitting_size(3, sizes) == 4
  assert resizing.smaller_size(100, sizes) == 64 and resizing.smaller_size(64, sizes) == 16
  assert resizing.smaller_size(16, sizes) == 8
  assert resizing.smaller_size(8, sizes) == 0  # (no compaction below FEWEST_ROWS = 8 rows)
  assert resizing.compacted_size(3, sizes) == 8 and resizing.compacted_size(20, sizes) == 64


def test_a_search_compacts_by_fours(random_model):
  """128 sentences (the sources four times over, finishing at or before their caps) step down
  through 64, 16 and 8 rows, not through every power of two: each size a search visits is
  programs to compile."""
  model, params, sources = random_model
  inputs = np.zeros((128, max(LENGTHS)), np.int32)
  for row, source in enumerate(sources * 4):
    inputs[row, :len(source)] = source
  counts = collections.Counter()
  search_lib.greedy_search(prepare(model, params), inputs, max_len=64,
                           caps=np.array(LENGTHS * 4) + 2, counts=counts)
  visited = {rows for rows, _ in counts["shapes"]}
  assert visited == {128, 64, 16, 8}, counts


@pytest.mark.parametrize("search", ["beam", "sampling"])
def test_a_set_decoded_with_stored_programs_equals_jax_jit(random_model, search, tmp_path,
                                                          monkeypatch):
  """Every program of a search that compacts and grows (start, loops, compactions, growth),
  compiled into the program store, then loaded by a new process (nothing held in memory)
  without tracing, some of them preloaded while a loop ran: the same sequences and scores as
  plain jax.jit."""
  model, params, sources = random_model
  cfg = helpers.section("decode", beam_size=3, sampling=search == "sampling", max_length=64,
                        max_length_a=1.0, max_length_b=2, batch_size=len(sources), seed=5)
  stored = (search_lib.beam_start, search_lib.beam_loop, search_lib.greedy_start,
            search_lib.greedy_loop, resizing.compact, resizing.grow)
  traced = []

  def listen(event, _, fun_name="", **__):
    if event.endswith("jaxpr_trace_duration"):
      traced.append(fun_name)

  def decode():
    traced.clear()
    counts = collections.Counter()
    out = [(rows, seqs, scores) for rows, seqs, scores in
           decode_batches(prepare(model, params), _eval_set(sources), cfg, counts=counts)]
    assert counts["compactions"] >= 2 and counts["growths"] >= 1, counts
    return out, [name for name in traced if name.startswith(tuple(f.__name__ for f in stored))]

  assert program_store.folder() is None  # (conftest: off unless a test turns it on)
  plain, _ = decode()
  monkeypatch.setattr(program_store, "_environment", lambda: str(tmp_path))  # (keys of its own)
  program_store.enable(tmp_path)
  for program in stored:  # (none held from an earlier test of this process)
    monkeypatch.setattr(program, "_programs", {})
  monitoring.register_event_duration_secs_listener(listen)
  try:
    compiled, compiled_traces = decode()
    for program in stored:  # (a new process)
      monkeypatch.setattr(program, "_programs", {})
    preloaded, preload = [], program_store.StoredJit.preload

    def counted_preload(self, *args, **kwargs):
      preloaded.append(preload(self, *args, **kwargs))
      return preloaded[-1]
    monkeypatch.setattr(program_store.StoredJit, "preload", counted_preload)
    loaded, loaded_traces = decode()
  finally:
    monitoring.unregister_event_duration_listener(listen)
  # (and the next compaction and loop were read while a loop ran, and run)
  unused = sum(len(program._preloaded) for program in stored)
  assert len(compiled_traces) >= 6 and loaded_traces == [] and sum(
      p is not None for p in preloaded) > unused
  for (rows, seqs, scores), *others in zip(plain, compiled, loaded):
    for other_rows, other_seqs, other_scores in others:
      np.testing.assert_array_equal(rows, other_rows)
      np.testing.assert_array_equal(seqs, other_seqs)
      np.testing.assert_array_equal(scores, other_scores)


def test_flat_beam_search_gives_the_reordering_search_s_n_best_and_scores(random_model):
  """`decode.beam_impl="flat"` (one append-only cache per sentence, read through each
  hypothesis's ancestry) finds what reordering each hypothesis's cache finds: the same 3-best
  and scores, through two compactions and a growth (the cache's slots and the ancestry grow
  by W per position)."""
  model, params, sources = random_model
  found = {}
  for impl in ("gather", "flat"):
    cfg = helpers.section("decode", beam_size=3, nbest=3, max_length=64, max_length_a=1.0,
                          max_length_b=2, batch_size=len(sources), beam_impl=impl)
    counts = collections.Counter()
    found[impl] = [(seqs, scores) for _, seqs, scores in
                   decode_batches(prepare(model, params), _eval_set(sources), cfg, counts=counts)]
    assert counts["compactions"] >= 2 and counts["growths"] >= 1, counts
  for (seqs, scores), (flat_seqs, flat_scores) in zip(found["gather"], found["flat"]):
    np.testing.assert_array_equal(flat_seqs, seqs)
    np.testing.assert_allclose(flat_scores, scores, rtol=1e-5)


def test_an_ensemble_decodes_within_its_shortest_member_s_positions(random_model):
  """Sources are cut and caps end at the smallest max_len of the members: a rotary member
  whose table ends sooner never reads past it (NaN there), whichever member comes first."""
  model, params, sources = random_model
  short = Transformer(dataclasses.replace(model.config, max_len=24))
  cfg = helpers.section("decode", beam_size=2, max_length=64, max_length_a=1.0,
                        max_length_b=30, batch_size=len(sources))

  def decode(models):
    out = {int(i): (s, c) for rows, seqs, scores in
           decode_batches(prepare(models, (params, params)), _eval_set(sources), cfg)
           for i, s, c in zip(rows, seqs, scores)}
    return [out[i] for i in range(len(sources))]

  expected = decode((short, short))
  assert all(np.isfinite(scores).all() for _, scores in expected)
  for got, want in zip(decode((model, short)), expected):
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_a_hypothesis_says_whether_it_ended_or_its_cap_stopped_it(random_model, search):
  """(What the server tells a client whose translation was cut.) A hypothesis that ended
  with EOS is shorter than its sentence's cap; one the cap stopped has exactly the cap's
  tokens. (The random model with a logits bias on EOS that ends some: the 32 sentences then
  hold both kinds.)"""
  small, params, sources = random_model
  model = Transformer(dataclasses.replace(small.config, output_bias=True))
  params = {**params, "output_logits_bias": np.zeros(16, np.float32).copy()}
  params["output_logits_bias"][1] = 1.3  # (EOS)
  cfg = helpers.section("decode", beam_size=3, nbest=2 if search == "beam" else 1,
                        greedy=search == "greedy", max_length=64, max_length_a=1.0,
                        max_length_b=2, batch_size=len(sources))
  tokenizer = types.SimpleNamespace(detokenize=lambda ids: " ".join(map(str, ids)))
  nbest = translate_nbest(prepare(model, params), _eval_set(sources), tokenizer, cfg)
  ended = []
  for source, hyps in zip(sources, nbest):
    cap = len(source) + 2  # (a * length + b, well under max_length)
    for h in hyps:
      assert h.ended == (len(h.ids) < cap) and len(h.ids) <= cap
      ended.append(h.ended)
  assert any(ended) and not all(ended), ended
