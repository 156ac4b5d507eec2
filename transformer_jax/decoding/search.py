"""Beam search and greedy decoding over the cached decoder, each one compiled program.

Beam search keeps `beam_size` live hypotheses per sentence; each step scores 2×beam
candidates, finishes those ending in EOS that rank within the top `beam_size` (as fairseq does,
so beam 1 is greedy), and stops when no live hypothesis can beat the best finished one under
the GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016).

Both take one model or an ensemble (a tuple of models and a tuple of their parameters, one
vocabulary): each step's log-probabilities are the members' average. Both can force a target
prefix per sentence (`prefix_BP`, 0-padded ids): its tokens are chosen, with their
log-probabilities counted, before the search goes on.
"""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp

from transformer_jax.data.tokenizer import EOS_ID, PAD_ID
from transformer_jax.model.transformer import Transformer, unscanned
from transformer_jax.ops.masking import NEG_INF


def length_penalty(length, alpha: float):
  """GNMT length normalisation ((5 + length) / 6) ** alpha."""
  return ((5.0 + length) / 6.0) ** alpha


def _flat(x):  # (B, W, ...) -> (B*W, ...)
  return x.reshape((-1,) + x.shape[2:])


def _unflat(x, batch_size):  # (B*W, ...) -> (B, W, ...)
  return x.reshape((batch_size, -1) + x.shape[1:])


def _gather_beams(tree, beam_indices_BW, batch_size):
  """Picks, for each sentence, the beams `beam_indices_BW` from every (B*W, ...) leaf.

  The encoder's keys/values cached for cross-attention are kept once per sentence (B rows,
  shared by its beams), so they are left as they are.
  """
  def gather(path, x):
    if x.ndim == 0:  # cache step counters are shared by all beams
      return x
    if any(getattr(k, "key", None) == "cross_attention" for k in path):
      return x
    x = _unflat(x, batch_size)
    idx = beam_indices_BW.reshape(beam_indices_BW.shape + (1,) * (x.ndim - 2))
    return _flat(jnp.take_along_axis(x, idx, axis=1))
  return jax.tree_util.tree_map_with_path(gather, tree)


def _members(model, params):
  """(models, params) of one model or an ensemble, each in the per-layer layout."""
  if not isinstance(model, tuple):
    model, params = (model,), (params,)
  pairs = [unscanned(m, p) for m, p in zip(model, params)]
  return tuple(m for m, _ in pairs), tuple(p for _, p in pairs)


def _decoder_step(models, params, caches, encoded, inputs, tokens_N):
  """Log-probabilities (N, V) of the next token after `tokens_N`, averaged over the ensemble's
  members; PAD is never generated."""
  total, new_caches = 0.0, []
  for model, p, cache, enc in zip(models, params, caches, encoded):
    logits, mutated = model.apply({"params": p, "cache": cache}, enc, inputs,
                                  tokens_N[:, None], decode=True, method=Transformer.decode,
                                  mutable=["cache"])
    total = total + jax.nn.log_softmax(logits[:, 0].astype(jnp.float32))
    new_caches.append(mutated["cache"])
  log_probs = total / len(models)
  return log_probs.at[:, PAD_ID].set(NEG_INF), tuple(new_caches)


def _force_prefix(log_probs_NV, prefix_BP, step, rows_per_sentence: int):
  """Log-probabilities with every token but the prefix's at `step` removed, for sentences
  whose prefix is that long (prefix_BP: 0-padded ids; None: no prefix)."""
  if prefix_BP is None:
    return log_probs_NV
  P = prefix_BP.shape[1]
  forced_B = jnp.take(prefix_BP, jnp.minimum(step, P - 1), axis=1)
  forced_N = jnp.repeat(jnp.where(step < P, forced_B, 0), rows_per_sentence)
  keep_NV = jax.nn.one_hot(forced_N, log_probs_NV.shape[-1], dtype=bool)
  return jnp.where((forced_N > 0)[:, None] & ~keep_NV, NEG_INF, log_probs_NV)


def _prepare(models, params, inputs_BS, beams: int, max_len: int):
  """Encodes each sentence once (per member) and creates the caches for `beams` hypotheses
  of each."""
  encoded, caches = [], []
  for model, p in zip(models, params):
    enc = model.apply({"params": p}, inputs_BS, method=Transformer.encode)
    _, mutated = model.apply({"params": p}, enc, inputs_BS, max_len, beams,
                             method=Transformer.init_cache, mutable=["cache"])
    encoded.append(enc)
    caches.append(mutated["cache"])
  return tuple(encoded), tuple(caches)


@flax.struct.dataclass
class BeamState:
  step: jax.Array                 # tokens generated so far
  live_seqs: jax.Array            # (B, W, L) live hypotheses
  live_logprobs: jax.Array        # (B, W) their total log-probability
  finished_seqs: jax.Array        # (B, W, L) finished hypotheses, best first
  finished_scores: jax.Array      # (B, W) their length-normalised scores
  cache: tuple                    # one decoding cache per ensemble member


@functools.partial(jax.jit, static_argnames=("model", "beam_size", "alpha", "max_len",
                                             "num_return", "min_len"))
def beam_search(model, params, inputs_BS, *, beam_size: int, alpha: float, max_len: int,
                num_return: int = 1, min_len: int = 0, prefix_BP=None):
  """Returns (sequences (B, W, max_len), scores (B, W)), best first; sequences end in EOS
  (or stop at max_len) and are padded with 0. The search runs until the best `num_return`
  finished hypotheses can no longer change, so those are exact n-best entries. EOS cannot
  end a hypothesis of fewer than `min_len` tokens. `model`/`params`: one model or tuples
  (an ensemble); `prefix_BP`: target prefixes to force (0-padded)."""
  B, W = inputs_BS.shape[0], beam_size
  models, params = _members(model, params)
  encoded, cache = _prepare(models, params, inputs_BS, W, max_len)
  state = BeamState(
      step=jnp.array(0, jnp.int32),
      live_seqs=jnp.zeros((B, W, max_len), jnp.int32),
      live_logprobs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (W - 1)), (B, 1)),
      finished_seqs=jnp.zeros((B, W, max_len), jnp.int32),
      finished_scores=jnp.full((B, W), NEG_INF),
      cache=cache)

  def not_done(s: BeamState):
    # Done when no live hypothesis can still beat the num_return-th finished one: its
    # log-prob only falls, and the length penalty is largest at max_len.
    best_possible = s.live_logprobs[:, 0] / length_penalty(max_len, alpha)
    return (s.step < max_len) & jnp.any(best_possible > s.finished_scores[:, num_return - 1])

  def step(s: BeamState):
    previous = jnp.where(s.step == 0, 0, jnp.take(s.live_seqs, s.step - 1, axis=2))
    log_probs, cache = _decoder_step(models, params, s.cache, encoded, inputs_BS,
                                     _flat(previous))
    log_probs = _force_prefix(log_probs, prefix_BP, s.step, W)
    if min_len:
      log_probs = jnp.where(s.step < min_len, log_probs.at[:, EOS_ID].set(NEG_INF), log_probs)
    V = log_probs.shape[-1]
    candidates_BWV = s.live_logprobs[..., None] + _unflat(log_probs, B)
    top_logprobs, top_ids = jax.lax.top_k(candidates_BWV.reshape(B, W * V), 2 * W)
    beam_ids, token_ids = top_ids // V, top_ids % V
    seqs = jnp.take_along_axis(s.live_seqs, beam_ids[..., None], axis=1)
    seqs = jax.lax.dynamic_update_slice(seqs, token_ids[..., None], (0, 0, s.step))
    is_last = s.step + 1 == max_len
    ended = (token_ids == EOS_ID) | is_last
    # Only candidates ranked within the top W may finish (the rest only matter as live ones).
    may_finish = ended & (jnp.arange(2 * W) < W)[None, :]
    new_scores = jnp.where(may_finish, top_logprobs / length_penalty(s.step + 1, alpha), NEG_INF)
    all_scores = jnp.concatenate([s.finished_scores, new_scores], axis=1)
    all_seqs = jnp.concatenate([s.finished_seqs, seqs], axis=1)
    finished_scores, keep = jax.lax.top_k(all_scores, W)
    finished_seqs = jnp.take_along_axis(all_seqs, keep[..., None], axis=1)
    live_candidates = jnp.where(ended, NEG_INF, top_logprobs)
    live_logprobs, keep = jax.lax.top_k(live_candidates, W)
    live_seqs = jnp.take_along_axis(seqs, keep[..., None], axis=1)
    live_beams = jnp.take_along_axis(beam_ids, keep, axis=1)
    return BeamState(step=s.step + 1, live_seqs=live_seqs, live_logprobs=live_logprobs,
                     finished_seqs=finished_seqs, finished_scores=finished_scores,
                     cache=_gather_beams(cache, live_beams, B))

  state = jax.lax.while_loop(not_done, step, state)
  return state.finished_seqs, state.finished_scores


def _filter_logits(logits_NV, temperature: float, top_k: int, top_p: float):
  """Temperature, then top-k, then nucleus (top-p) filtering; removed tokens get NEG_INF."""
  logits_NV = logits_NV / temperature
  if top_k > 0:
    kth = jax.lax.top_k(logits_NV, top_k)[0][:, -1:]
    logits_NV = jnp.where(logits_NV < kth, NEG_INF, logits_NV)
  if top_p < 1.0:
    sorted_NV = jnp.sort(logits_NV, axis=-1)[:, ::-1]
    cumulative = jnp.cumsum(jax.nn.softmax(sorted_NV, axis=-1), axis=-1)
    # The smallest prefix whose probability reaches top_p: keep tokens up to that one.
    cutoff_index = jnp.sum(cumulative < top_p, axis=-1, keepdims=True)
    cutoff = jnp.take_along_axis(sorted_NV, cutoff_index, axis=-1)
    logits_NV = jnp.where(logits_NV < cutoff, NEG_INF, logits_NV)
  return logits_NV


@functools.partial(jax.jit, static_argnames=("model", "max_len", "temperature", "top_k",
                                             "top_p"))
def greedy_search(model, params, inputs_BS, *, max_len: int, rng=None, temperature: float = 1.0,
                  top_k: int = 0, top_p: float = 1.0, prefix_BP=None):
  """Argmax decoding, or ancestral sampling when `rng` is given (with temperature, top-k and
  top-p filtering). Returns (sequences (B, max_len), total log-probabilities (B,)).
  `model`/`params` and `prefix_BP` as for beam_search."""
  B = inputs_BS.shape[0]
  models, params = _members(model, params)
  encoded, cache = _prepare(models, params, inputs_BS, 1, max_len)

  def not_done(carry):
    step, _, _, done, _ = carry
    return (step < max_len) & ~jnp.all(done)

  def step_fn(carry):
    step, seqs, logprobs, done, cache = carry
    previous = jnp.where(step == 0, 0, jnp.take(seqs, step - 1, axis=1))
    log_probs, cache = _decoder_step(models, params, cache, encoded, inputs_BS, previous)
    log_probs = _force_prefix(log_probs, prefix_BP, step, 1)
    if rng is None:
      token = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
    else:
      filtered = _filter_logits(log_probs, temperature, top_k, top_p)
      token = jax.random.categorical(jax.random.fold_in(rng, step), filtered).astype(jnp.int32)
    token = jnp.where(done, PAD_ID, token)
    logprobs = logprobs + jnp.where(done, 0.0, jnp.take_along_axis(
        log_probs, token[:, None], axis=1)[:, 0])
    seqs = jax.lax.dynamic_update_slice(seqs, token[:, None], (0, step))
    return step + 1, seqs, logprobs, done | (token == EOS_ID), cache

  carry = (jnp.array(0, jnp.int32), jnp.zeros((B, max_len), jnp.int32), jnp.zeros((B,)),
           jnp.zeros((B,), bool), cache)
  _, seqs, logprobs, _, _ = jax.lax.while_loop(not_done, step_fn, carry)
  return seqs, logprobs
