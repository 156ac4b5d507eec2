"""Decoding whole sets in flight: a sentence's translation does not depend on what else is in
the slots, when it was put in, or the width class the slots ran at."""

import collections
import dataclasses
import threading
import types

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax import monitoring

from tests import helpers
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.decoding import batches, scheduler, slots
from transformer_jax.decoding import stream as stream_lib
from transformer_jax.decoding.batches import decode_set, sentence_caps, translate_nbest
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import program_store

# 32 source lengths from 1 to 40 tokens, over a set's two width classes (24, 48 at max_len
# 64) and a server's three (16, 32, 64).
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
@pytest.mark.parametrize("search", ["beam", "greedy", "sampling"])
def test_a_translation_is_the_same_alone_and_among_others_inserted_early_or_late(
    random_model, search, dtype):
  """A sentence decoded alone, and among the 32 in 4 slots (each put into a slot freed by
  another, beside longer and shorter neighbours, the slots widening and narrowing around it),
  and among the longer or the shorter half only (it goes in last or first): the same
  hypotheses and scores, a seeded sample too."""
  model, params, sources = random_model
  # (EOS made unlikely: translations run long, and outgrow their width class's cache)
  model = Transformer(dataclasses.replace(model.config, dtype=dtype, output_bias=True))
  params = {**params, "output_logits_bias": np.zeros(16, np.float32).copy()}
  params["output_logits_bias"][1] = -2.0
  cfg = helpers.section("decode", beam_size=3, greedy=search == "greedy",
                        sampling=search == "sampling", max_length=64, max_length_a=1.0,
                        max_length_b=30, batch_size=4, seed=7)
  scorer = prepare(model, params)

  def decode(indices, counts=None):
    slots_ = batches.decoder(scorer, cfg)
    out = decode_set(scorer, _eval_set([sources[i] for i in indices]), cfg, decoder_=slots_)
    if counts is not None:
      counts.update(slots_.counts)
    return dict(zip(indices, out))

  counts = collections.Counter()
  everything = decode(range(32), counts)
  assert counts["resizes"] >= 3 and counts["calls"] > 8, counts
  shorter, longer = decode(range(16)), decode(range(16, 32))
  for i in range(0, 32, 3):  # (every third, short to long, alone: each a set of its own)
    alone = decode([i])[i]
    for other in (everything[i], (shorter if i < 16 else longer)[i]):
      np.testing.assert_array_equal(alone[0], other[0])
      np.testing.assert_allclose(alone[1], other[1], rtol=1e-5 if dtype == "float32" else 2e-3)
    # ...and it ends by the sentence's own cap: len + 30 tokens.
    assert (everything[i][0][0] > 0).sum() <= LENGTHS[i] + 30


def test_each_sentence_has_its_own_cap_and_an_empty_row_none():
  cfg = helpers.section("decode", max_length=20, max_length_a=1.5, max_length_b=3)
  inputs = np.array([[5, 6, 1, 0], [5, 6, 7, 1], [0, 0, 0, 0]])
  np.testing.assert_array_equal(sentence_caps(cfg, inputs, None, 64), [7, 9, 0])
  np.testing.assert_array_equal(sentence_caps(cfg, inputs, None, 8), [7, 8, 0])
  prefixes = np.array([[4, 4, 4, 4, 4, 4, 4, 4], [4, 0, 0, 0, 0, 0, 0, 0], [0] * 8])
  np.testing.assert_array_equal(sentence_caps(cfg, inputs, prefixes, 64), [9, 9, 0])


def test_a_set_runs_one_advance_per_width_class_and_the_resizes_between(random_model):
  """The programs a set needs are known before its first sentence: an advance per width
  class its sentences and outputs reach, a resize per move between neighbouring classes
  (the 32 sources, longest first, in 8 slots: classes 48 and 24)."""
  model, params, sources = random_model
  cfg = helpers.section("decode", beam_size=2, max_length=64, max_length_a=1.0,
                        max_length_b=2, batch_size=8)
  traced = []

  def listen(event, _, fun_name="", **__):
    if event.endswith("jaxpr_trace_duration"):
      traced.append(fun_name)
  for program in (slots.beam_advance, slots.resized):
    program._jitted.clear_cache()
  monitoring.register_event_duration_secs_listener(listen)
  try:
    decode_set(prepare(model, params), _eval_set(sources), cfg)
  finally:
    monitoring.unregister_event_duration_listener(listen)
  names = collections.Counter(name for name in traced
                              if name.startswith(("beam_advance", "resized")))
  assert names == {"beam_advance": 2, "resized": 1}, names


@pytest.mark.parametrize("search", ["beam", "sampling"])
def test_a_set_decoded_with_stored_programs_equals_jax_jit(random_model, search, tmp_path,
                                                          monkeypatch):
  """Every program of a set decoded in flight (advances at two width classes, the resize
  between them), compiled into the program store, then loaded by a new process (nothing
  held in memory) without tracing: the same sequences and scores as plain jax.jit."""
  model, params, sources = random_model
  cfg = helpers.section("decode", beam_size=3, sampling=search == "sampling", max_length=64,
                        max_length_a=1.0, max_length_b=2, batch_size=4, seed=5)
  stored = (slots.beam_advance, slots.greedy_advance, slots.resized)
  traced = []

  def listen(event, _, fun_name="", **__):
    if event.endswith("jaxpr_trace_duration"):
      traced.append(fun_name)

  def decode():
    traced.clear()
    out = decode_set(prepare(model, params), _eval_set(sources), cfg)
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
    loaded, loaded_traces = decode()
  finally:
    monitoring.unregister_event_duration_listener(listen)
  assert len(compiled_traces) >= 3 and loaded_traces == []
  for (seqs, scores), *others in zip(plain, compiled, loaded):
    for other_seqs, other_scores in others:
      np.testing.assert_array_equal(seqs, other_seqs)
      np.testing.assert_array_equal(scores, other_scores)


def test_flat_beam_search_gives_the_reordering_search_s_n_best_and_scores(random_model):
  """`decode.beam_impl="flat"` (one append-only cache per sentence, read through each
  hypothesis's ancestry) finds what reordering each hypothesis's cache finds: the same 3-best
  and scores, sentences inserted into slots mid-flight and the slots resized (the cache's
  slots and the ancestry by W per position)."""
  model, params, sources = random_model
  found = {}
  for impl in ("gather", "flat"):
    cfg = helpers.section("decode", beam_size=3, nbest=3, max_length=64, max_length_a=1.0,
                          max_length_b=2, batch_size=8, beam_impl=impl)
    found[impl] = decode_set(prepare(model, params), _eval_set(sources), cfg)
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
    return decode_set(prepare(models, (params, params)), _eval_set(sources), cfg)

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


def test_fewer_beams_in_wider_slots_search_as_a_beam_of_their_own_width(random_model):
  """A request for beam 2 on a beam-4 server decodes in the server's 4-beam slots (no new
  program): the same 2-best and scores as a beam-2 search."""
  model, params, sources = random_model
  scorer = prepare(model, params)
  narrow = helpers.section("decode", beam_size=2, nbest=2, length_penalty=0.6, max_length=64,
                           max_length_a=1.0, max_length_b=2, batch_size=8)
  wide = dataclasses.replace(narrow, beam_size=4)
  alone = decode_set(scorer, _eval_set(sources), narrow)
  in_wider = decode_set(scorer, _eval_set(sources), narrow,
                        decoder_=batches.decoder(scorer, wide))
  for (seqs, scores), (wide_seqs, wide_scores) in zip(alone, in_wider):
    np.testing.assert_array_equal(wide_seqs, seqs)
    np.testing.assert_allclose(wide_scores, scores, rtol=1e-5)


def test_a_stream_decodes_sentences_put_from_threads_as_offline_and_skips_the_cancelled(
    random_model):
  """Sentences put into a `Stream` by four threads at once, in arrival order (no sorting, no
  batch formed), each with its own length penalty: each the same as decoded offline with its
  settings (the stream's slots with every option compiled in and a server's narrower width
  classes; offline's with those its settings ask, none, and a set's classes); a sentence
  cancelled before it reaches a slot is never delivered; a failure of the decoder reaches
  every sentence it held."""
  model, params, sources = random_model
  scorer = prepare(model, params)
  cfg = helpers.section("decode", beam_size=3, max_length=64, max_length_a=1.0,
                        max_length_b=2, batch_size=4)
  decoder = batches.decoder(scorer, cfg, every_option=True, arrival_order=True)
  stream = stream_lib.Stream(decoder, max_steps=2)
  results, threads = {}, []
  alphas = [0.0, 0.6, 1.0, 2.0]

  def client(k):
    settings = dataclasses.replace(cfg, length_penalty=alphas[k])
    gathered = batches.Gathered(settings, 8)
    mine = batches.sentences(_eval_set(sources[k::4]), settings, 64, gathered.deliver,
                             longest_first=False)
    stream.put(mine)
    while gathered.waiting:
      threading.Event().wait(0.01)
    results[k] = gathered.results

  try:
    for k in range(4):
      threads.append(threading.Thread(target=client, args=(k,)))
      threads[-1].start()
    for thread in threads:
      thread.join(120)
    cancelled, delivered = scheduler.Sentence(sources[0], 10, {}), []
    cancelled.deliver = lambda *a: delivered.append(a)
    cancelled.cancelled = True
    errors = []
    broken = scheduler.Sentence(np.array([3, 4, 1]), 10, {"alpha": "not a number"},
                                deliver=lambda *a: None, on_error=errors.append)
    stream.put([cancelled, broken])
  finally:
    stream.close()
  assert delivered == [] and len(errors) == 1
  for k in range(4):
    offline = decode_set(scorer, _eval_set(sources[k::4]),
                         dataclasses.replace(cfg, length_penalty=alphas[k]))
    for (seqs, scores), (got_seqs, got_scores) in zip(offline, results[k]):
      np.testing.assert_array_equal(got_seqs, seqs)
      np.testing.assert_allclose(got_scores, scores, rtol=1e-5)


def test_a_stream_that_would_never_look_at_its_queue_is_refused(random_model):
  """max_steps is how many steps may pass between two looks at the queue: 0 would run a call
  until its slots are free, leaving a request that arrives meanwhile waiting."""
  model, params, _ = random_model
  decoder = batches.decoder(prepare(model, params), helpers.section("decode", batch_size=4))
  with pytest.raises(ValueError, match="max_steps >= 1"):
    stream_lib.Stream(decoder, max_steps=0)
