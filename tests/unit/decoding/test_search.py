"""Beam search and greedy decoding against brute force on a tiny random model."""

import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from transformer_jax.data.tokenizer import EOS_ID
from transformer_jax.decoding import beam_caches
from transformer_jax.decoding import search as decode
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.model.transformer import Transformer
from transformer_jax.ops.masking import NEG_INF
from transformer_jax.ops.platform import tracing_for

VOCAB = 5  # PAD, EOS, UNK and two more: small enough to enumerate every output


@pytest.fixture(scope="module")
def tiny():
  cfg = helpers.section("model", vocab_size=VOCAB, d_model=16, num_heads=2, d_ff=32,
                        num_encoder_layers=1, num_decoder_layers=2, dropout_rate=0.0, max_len=16)
  model = Transformer(cfg)
  inputs = jnp.array([[3, 4, 2, 1, 0], [4, 4, 3, 3, 1], [2, 1, 0, 0, 0]])
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(1), inputs,
                                             inputs[:, :3])["params"])
  # Sharpen the output distribution so that the best sequence is not trivially short.
  params = jax.tree_util.tree_map(lambda x: x * 3.0, params)
  return model, params, inputs


def _all_outputs(max_len):
  """Every sequence the decoders may produce: tokens 2..V-1, ended by EOS or by max_len."""
  outs = []
  for n in range(1, max_len + 1):
    for body in itertools.product(range(2, VOCAB), repeat=n - 1):
      outs.append(list(body) + [EOS_ID])
    if n == max_len:
      outs += [list(b) for b in itertools.product(range(2, VOCAB), repeat=n)]
  return outs


def _brute_force_best(model, params, inputs, max_len, alpha):
  outs = _all_outputs(max_len)
  targets = np.zeros((len(outs), max_len), np.int32)
  for i, o in enumerate(outs):
    targets[i, :len(o)] = o
  lengths = (targets > 0).sum(axis=1)
  best = []
  for row in inputs:
    lp = helpers.sequence_log_prob(model, params, jnp.tile(row, (len(outs), 1)), targets)
    scores = np.asarray(lp) / decode.length_penalty(lengths, alpha)
    best.append((targets[int(np.argmax(scores))], float(np.max(scores))))
  return best


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_beam_search_finds_brute_force_best(tiny, alpha):
  model, params, inputs = tiny
  max_len = 4
  seqs, scores = decode.beam_search(prepare(model, params), inputs, beam_size=64, alpha=alpha,
                                    max_len=max_len)
  for b, (best_seq, best_score) in enumerate(_brute_force_best(model, params, inputs, max_len,
                                                               alpha)):
    np.testing.assert_array_equal(np.asarray(seqs[b, 0]), best_seq)
    # (cached steps and full scoring sum in other orders: a few 1e-6 apart in f32, which is
    # over rtol alone for a near-zero log-probability, as on an AMX Xeon)
    np.testing.assert_allclose(float(scores[b, 0]), best_score, rtol=1e-4, atol=2e-5)


def test_beam_one_equals_greedy(tiny):
  model, params, inputs = tiny
  beam, _ = decode.beam_search(prepare(model, params), inputs, beam_size=1, alpha=0.0, max_len=6)
  greedy, _ = decode.greedy_search(prepare(model, params), inputs, max_len=6)
  np.testing.assert_array_equal(np.asarray(beam[:, 0]), np.asarray(greedy))


@pytest.mark.parametrize("min_len", [3, 6])
def test_min_length_keeps_eos_from_ending_short_hypotheses(tiny, min_len):
  model, params, inputs = tiny
  free, _ = decode.beam_search(prepare(model, params), inputs, beam_size=2, alpha=0.6, max_len=6)

  def first_eos(seqs):
    return [list(s).index(EOS_ID) if EOS_ID in s else len(s)
            for s in np.asarray(seqs).reshape(-1, 6)]

  assert min(first_eos(free)) < 3  # without the limit, some hypotheses end early
  seqs, _ = decode.beam_search(prepare(model, params), inputs, beam_size=2, alpha=0.6, max_len=6,
                               min_len=min_len)
  assert min(first_eos(seqs)) >= min_len  # at least min_len tokens before any EOS


def test_beam_scores_sorted_and_consistent(tiny):
  model, params, inputs = tiny
  seqs, scores = decode.beam_search(prepare(model, params), inputs, beam_size=4, alpha=0.6,
                                    max_len=6)
  scores = np.asarray(scores)
  assert np.all(np.diff(scores, axis=1) <= 1e-6)
  # Each returned score is the model's own length-normalised log-probability of its sequence.
  for b in range(inputs.shape[0]):
    lp = helpers.sequence_log_prob(model, params, jnp.tile(inputs[b], (4, 1)), seqs[b])
    lengths = np.asarray((seqs[b] > 0).sum(axis=1))
    found = scores[b] > NEG_INF / 2  # early stopping may leave fewer than W finished
    assert found[0]
    np.testing.assert_allclose((np.asarray(lp) / decode.length_penalty(lengths, 0.6))[found],
                               scores[b][found], rtol=1e-4, atol=1e-5)


def test_nbest_is_sorted_and_starts_with_the_beam_output(tiny):
  model, params, inputs = tiny
  best, _ = decode.beam_search(prepare(model, params), inputs, beam_size=4, alpha=0.6, max_len=6)
  nbest, scores = decode.beam_search(prepare(model, params), inputs, beam_size=4, alpha=0.6,
                                     max_len=6, num_return=3)
  scores = np.asarray(scores)
  assert np.all(scores[:, :3] > NEG_INF / 2)  # three real hypotheses each
  assert np.all(np.diff(scores[:, :3], axis=1) <= 1e-6)
  np.testing.assert_array_equal(np.asarray(nbest[:, 0]), np.asarray(best[:, 0]))
  assert len({tuple(np.asarray(s)) for s in nbest[0, :3]}) == 3  # distinct hypotheses


def test_sampling_is_reproducible_with_a_seed_and_varies_across_seeds(tiny):
  model, params, inputs = tiny

  def sample(seed, **kw):
    return np.asarray(decode.greedy_search(prepare(model, params), jnp.tile(inputs, (8, 1)),
                                           max_len=6, rng=jax.random.PRNGKey(seed), **kw)[0])

  np.testing.assert_array_equal(sample(0), sample(0))
  assert not np.array_equal(sample(0), sample(1))
  # top_k=1 keeps only the argmax: sampling becomes greedy.
  greedy, _ = decode.greedy_search(prepare(model, params), jnp.tile(inputs, (8, 1)), max_len=6)
  np.testing.assert_array_equal(sample(3, top_k=1), np.asarray(greedy))
  # A tiny nucleus also keeps only the most likely token.
  np.testing.assert_array_equal(sample(4, top_p=1e-6), np.asarray(greedy))


def test_an_ensemble_of_one_or_of_two_copies_equals_the_model(tiny):
  model, params, inputs = tiny
  kw = dict(beam_size=3, alpha=0.6, max_len=6)
  seqs, scores = decode.beam_search(prepare(model, params), inputs, **kw)
  for members in (1, 2):
    e_seqs, e_scores = decode.beam_search(prepare((model,) * members, (params,) * members), inputs,
                                          **kw)
    np.testing.assert_array_equal(np.asarray(e_seqs), np.asarray(seqs))
    np.testing.assert_array_equal(np.asarray(e_scores), np.asarray(scores))
  g, g_lp = decode.greedy_search(prepare(model, params), inputs, max_len=6)
  e, e_lp = decode.greedy_search(prepare((model, model), (params, params)), inputs, max_len=6)
  np.testing.assert_array_equal(np.asarray(e), np.asarray(g))
  np.testing.assert_array_equal(np.asarray(e_lp), np.asarray(g_lp))


def test_an_ensemble_scores_by_its_members_average_log_probability(tiny):
  model, params, inputs = tiny
  other = jax.tree_util.tree_map(lambda x: -0.5 * x, params)  # a different model
  seqs, scores = decode.beam_search(prepare((model, model), (params, other)), inputs, beam_size=3,
                                    alpha=0.0, max_len=6)
  for b in range(inputs.shape[0]):
    rows = jnp.tile(inputs[b], (3, 1))
    mean = (np.asarray(helpers.sequence_log_prob(model, params, rows, seqs[b]))
            + np.asarray(helpers.sequence_log_prob(model, other, rows, seqs[b]))) / 2
    found = np.asarray(scores[b]) > NEG_INF / 2
    np.testing.assert_allclose(np.asarray(scores[b])[found], mean[found], rtol=1e-4, atol=1e-5)
  # ... and the ensemble's best is the brute-force best under that average.
  best, _ = decode.beam_search(prepare((model, model), (params, other)), inputs, beam_size=8,
                               alpha=0.0, max_len=3)
  outs = _all_outputs(3)
  targets = np.zeros((len(outs), 3), np.int32)
  for i, o in enumerate(outs):
    targets[i, :len(o)] = o
  for b, row in enumerate(inputs):
    rows = jnp.tile(row, (len(outs), 1))
    mean = (np.asarray(helpers.sequence_log_prob(model, params, rows, targets))
            + np.asarray(helpers.sequence_log_prob(model, other, rows, targets))) / 2
    np.testing.assert_array_equal(np.asarray(best[b, 0]), targets[int(np.argmax(mean))])


@pytest.mark.parametrize("search", ["beam", "greedy"])
def test_a_forced_prefix_starts_every_output_and_is_scored_as_teacher_forcing(tiny, search):
  model, params, inputs = tiny
  prefix = jnp.array([[3, 4, 4], [4, 0, 0], [0, 0, 0]])  # (the last sentence: none)
  if search == "beam":
    seqs, scores = decode.beam_search(prepare(model, params), inputs, beam_size=3, alpha=0.0,
                                      max_len=6, prefix_BP=prefix)
    free, _ = decode.beam_search(prepare(model, params), inputs, beam_size=3, alpha=0.0, max_len=6)
    seqs, scores, free = seqs[:, 0], scores[:, 0], free[:, 0]
  else:
    seqs, scores = decode.greedy_search(prepare(model, params), inputs, max_len=6, prefix_BP=prefix)
    free, _ = decode.greedy_search(prepare(model, params), inputs, max_len=6)
  seqs = np.asarray(seqs)
  assert list(seqs[0, :3]) == [3, 4, 4] and seqs[1, 0] == 4
  np.testing.assert_array_equal(seqs[2], np.asarray(free[2]))  # no prefix: as without
  # The score (total log-probability, alpha 0) is the teacher-forced one of the output,
  # forced tokens included.
  np.testing.assert_allclose(np.asarray(scores),
                             np.asarray(helpers.sequence_log_prob(model, params, inputs, seqs)),
                             rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", [{"positional_encoding": "sinusoidal"},
                                     {"positional_encoding": "relative"},
                                     {"num_kv_heads": 1}])
def test_flat_beam_search_equals_reordering_caches_in_each_attention_variant(variant):
  """The flat search's shared cache read through an ancestry mask, with each way positions
  and heads enter self-attention: relative biases by the slot's step, rotary keys rotated
  before they are written (the default, also in test_batches), one key/value head shared.
  The same 3-best and scores as reordering each hypothesis's cache, forced prefixes and
  per-sentence caps included."""
  cfg = helpers.section("model", vocab_size=12, d_model=16, num_heads=2, d_ff=32,
                        num_encoder_layers=1, num_decoder_layers=2, dropout_rate=0.0,
                        max_len=48, dtype="float32", **variant)
  model = Transformer(cfg)
  rng = np.random.default_rng(0)
  lengths = rng.integers(2, 8, (6, 1))
  inputs = jnp.asarray(rng.integers(2, 12, (6, 7)) * (np.arange(7)[None] < lengths), jnp.int32)
  params = nn.meta.unbox(jax.jit(model.init)(jax.random.PRNGKey(1), inputs,
                                             inputs[:, :3])["params"])
  params = jax.tree_util.tree_map(lambda x: x * 2.0, params)  # (longer outputs)
  kw = dict(beam_size=3, alpha=0.6, max_len=40, num_return=3,
            caps=np.array([40, 3, 30, 0, 35, 20]),
            prefix_BP=jnp.array([[5, 6], [0, 0], [7, 0], [3, 3], [0, 0], [4, 0]]))
  seqs, scores = decode.beam_search(prepare(model, params), inputs, beam_impl="gather", **kw)
  flat_seqs, flat_scores = decode.beam_search(prepare(model, params), inputs, beam_impl="flat",
                                              **kw)
  np.testing.assert_array_equal(flat_seqs, seqs)
  np.testing.assert_allclose(flat_scores, scores, rtol=1e-5)


def test_auto_shares_caches_on_every_platform():
  for platform in ("cpu", "gpu", "tpu"):
    with tracing_for(platform):
      assert beam_caches.shares_caches("auto") and beam_caches.shares_caches("flat")
      assert not beam_caches.shares_caches("gather")
