"""Beam search and greedy decoding over the cached decoder.

Beam search keeps `beam_size` live hypotheses per sentence; each step scores 2×beam
candidates, finishes those ending in EOS that rank within the top `beam_size` (as fairseq does,
so beam 1 is greedy), and stops when no live hypothesis can beat the best finished one under
the GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016).

Every sentence has a length cap of its own (`caps`: the most tokens it may have, EOS
included): its hypotheses end there, and its search, like its output, depends on nothing else
in its batch. A sentence leaves the search as soon as it is done: the compiled search loop
runs until it has to stop for one of `resizing`'s reasons (few sentences left, the cache full),
then the state is compacted or grown and the loop goes on (see `resizing`).

Both take a model's decoding interface (`model.stepwise`; one model or an ensemble of several,
one vocabulary, made ready once for many batches by `ensemble.prepare`), whose step gives
each row's log-probabilities and whose cache description says which axes resizing and
reordering touch: the search imports no model. Both can force a target prefix per sentence
(`prefix_BP`, 0-padded ids): its tokens are chosen, with their log-probabilities counted,
before the search goes on.
"""

from __future__ import annotations

import functools
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.data.tokenizer import EOS_ID, PAD_ID
from transformer_jax.decoding import beam_caches, resizing
from transformer_jax.decoding.rules import TokenRules
from transformer_jax.ops.masking import NEG_INF
from transformer_jax.ops.top_k import top_k
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.parallel.program_store import stored_jit


def length_penalty(length, alpha: float):
  """GNMT length normalisation ((5 + length) / 6) ** alpha."""
  return ((5.0 + length) / 6.0) ** alpha


def _flat(x):  # (B, W, ...) -> (B*W, ...)
  return x.reshape((-1,) + x.shape[2:])


def _unflat(x, batch_size):  # (B*W, ...) -> (B, W, ...)
  return x.reshape((batch_size, -1) + x.shape[1:])


def _forced(prefix_BP, step, rows_per_sentence: int):
  """(N,) each row's token forced by its sentence's prefix at `step`, 0 where none is
  (prefix_BP: 0-padded ids; None: no prefix)."""
  if prefix_BP is None:
    return None
  P = prefix_BP.shape[1]
  forced_B = jnp.take(prefix_BP, jnp.minimum(step, P - 1), axis=1)
  return jnp.repeat(jnp.where(step < P, forced_B, 0), rows_per_sentence)


def _next_log_probs(scorer, s, tokens_N, history_NC, rules: TokenRules, reads_BWS=None):
  """Log-probabilities (N, V) of the next token after `tokens_N` and the new cache: PAD is
  never generated; a token forced by the prefix is the only one its row may take; `rules`
  rewrite each row's logits from its tokens so far (`history_NC`). `reads_BWS`: the cache
  slots each row reads, when a sentence's hypotheses share one (`beam_caches.reads`)."""
  rows_per_sentence = tokens_N.shape[0] // s.inputs.shape[0]
  forced_N = _forced(s.prefix, s.step, rows_per_sentence)
  adjust = None
  if rules.active:
    free_N = jnp.ones(tokens_N.shape, bool) if forced_N is None else forced_N == 0
    adjust = functools.partial(rules.adjust, tokens_NC=history_NC, length=s.step,
                               free_N=free_N)
  log_probs, cache = scorer.step(s.cache, s.inputs, tokens_N, reads_BWS, adjust)
  log_probs = log_probs.at[:, PAD_ID].set(NEG_INF)
  if forced_N is not None:
    keep_NV = jax.nn.one_hot(forced_N, log_probs.shape[-1], dtype=bool)
    log_probs = jnp.where((forced_N > 0)[:, None] & ~keep_NV, NEG_INF, log_probs)
  return log_probs, cache


def _cache(scorer, inputs_BS, rows_per_sentence: int, capacity: int, flat: bool = False):
  """(the cache, its description (`resizing.cache_axes`)): each sentence encoded once and
  `rows_per_sentence` rows of it, `capacity` positions long; `flat`: one self-attention
  cache per sentence that its rows share (`beam_caches`)."""
  cache = scorer.new_cache(inputs_BS, rows_per_sentence, capacity, flat)
  return cache, resizing.cache_axes(scorer, cache)


def _caps(caps, max_len: int, rows: int) -> np.ndarray:
  """Each row's length cap: `caps` (0 = an empty row, done at once) or max_len for all."""
  if caps is None:
    return np.full((rows,), max_len, np.int32)
  caps = np.asarray(caps, np.int32)
  if caps.shape != (rows,) or caps.max(initial=0) > max_len:
    raise ValueError(f"caps must be {rows} lengths <= max_len={max_len}, got {caps}")
  return caps


def _run(state, advance, rows: int, unit: int, store, counts=None):
  """Runs the compiled search loop `advance` until every sentence is done; in between, the
  state loses the finished sentences (`resizing.compact`) or grows (`resizing.grow`).
  `store(state, sentences)` saves the results of the state's rows (sentences: their
  indices in the batch) before they may leave. `counts` (a Counter, or None) adds up the
  sentence-steps run ("sentence_steps": rows x steps), those a search of the whole batch to
  its last step would have run ("batch_steps"), the times the state was compacted
  ("compactions") and grown ("growths"), and collects the (rows, cache length) shapes run
  ("shapes")."""
  sizes = resizing.row_sizes(rows, unit, resizing.COMPACTION_RATIO)
  sentences, step = np.arange(rows), 0
  while True:
    stop_at = resizing.smaller_size(len(sentences), sizes)
    shape = (len(sentences), state.capacity)
    state, active = advance(state, stop_at=stop_at)
    _preload_next(advance, state, len(sentences), stop_at, sizes)  # (while the loop runs)
    active, previous, step = mesh_lib.fetch(active), step, int(mesh_lib.fetch(state.step))
    if counts is not None:
      counts["sentence_steps"] += shape[0] * (step - previous)
      counts.setdefault("shapes", set()).add(shape)
    if not active.any():
      break
    if active.sum() <= stop_at:  # fewer sentences: a smaller batch
      store(state, sentences)
      size = resizing.compacted_size(int(active.sum()), sizes)
      keep = np.concatenate([np.flatnonzero(active), np.flatnonzero(~active)])[:size]
      state = resizing.compact(state, keep.astype(np.int32), rows=len(sentences))
      sentences = sentences[keep]
      if counts is not None:
        counts["compactions"] += 1
    if step == state.capacity:
      state = resizing.grow(state, length=state.capacity + resizing.SEGMENT)
      if counts is not None:
        counts["growths"] += 1
  store(state, sentences)
  if counts is not None:
    counts["batch_steps"] += rows * step


def _preload_next(advance, state, rows: int, stop_at: int, sizes: list[int]):
  """Loads the stored programs a search is likely to run after its loop at `rows` rows (the
  compaction into `stop_at` rows and the loop at that size), while the loop computes, so
  that their loading costs no time (`program_store`: `advance` is a partial of a
  StoredJit; nothing happens when the store is off or does not hold them)."""
  if not stop_at:
    return
  keep = jax.ShapeDtypeStruct((stop_at,), jnp.int32)
  compacted = resizing.compact.preload(state, keep, rows=rows)
  if compacted is not None:
    advance.func.preload(*advance.args, compacted, **advance.keywords,
                         stop_at=resizing.smaller_size(stop_at, sizes))


@flax.struct.dataclass
class SearchState:
  """What every search carries (what `_run` and `resizing` rely on); `capacity`: the cache's
  length, that of the subclass's token buffers."""
  step: jax.Array                 # tokens generated so far (the same for every row)
  caps: jax.Array                 # (B,) the most tokens each sentence (row) may have
  inputs: jax.Array               # (B, S) source ids
  prefix: jax.Array | None        # (B, P) target prefixes to force (0-padded), or None
  cache: Any                      # the decoding cache (of the model, or each ensemble model's)
  cache_axes: tuple = flax.struct.field(pytree_node=False)  # (resizing.cache_axes)


@flax.struct.dataclass
class BeamState(SearchState):
  live_seqs: jax.Array            # (B, W, C) live hypotheses
  live_logprobs: jax.Array        # (B, W) their total log-probability
  finished_seqs: jax.Array        # (B, W, C) finished hypotheses, best first
  finished_scores: jax.Array      # (B, W) their length-normalised scores
  ancestry: jax.Array | None      # flat search: (B, W, W * C) the cache slots each live
                                  # hypothesis reads (its ancestors'); None: caches reordered
  grown = ("live_seqs", "finished_seqs", "ancestry")  # (resizing.grow: their last axis)

  @property
  def capacity(self) -> int:
    return self.live_seqs.shape[-1]


@stored_jit(static_argnames=("beam_size", "beam_impl"))
def beam_start(scorer, inputs_BS, caps_B, prefix_BP, *, beam_size: int,
               beam_impl: str = "auto") -> BeamState:
  """Beam search's first program: the batch encoded, its caches made, no token yet."""
  B, W, C = inputs_BS.shape[0], beam_size, resizing.SEGMENT
  flat = beam_caches.shares_caches(beam_impl)
  cache, cache_axes = _cache(scorer, inputs_BS, W, C, flat)
  return BeamState(
      step=jnp.array(0, jnp.int32), caps=caps_B, inputs=inputs_BS, prefix=prefix_BP,
      live_seqs=jnp.zeros((B, W, C), jnp.int32),
      live_logprobs=jnp.tile(jnp.array([0.0] + [NEG_INF] * (W - 1)), (B, 1)),
      finished_seqs=jnp.zeros((B, W, C), jnp.int32),
      finished_scores=jnp.full((B, W), NEG_INF),
      ancestry=jnp.zeros((B, W, W * C), bool) if flat else None,
      cache=cache, cache_axes=cache_axes)


def _beam_active(s: BeamState, alpha: float, num_return: int):
  """(B,) whether each sentence's search goes on: it is under its cap, and a live hypothesis
  can still beat its num_return-th finished one (its log-prob only falls, and the length
  penalty is largest at the cap)."""
  best_possible = s.live_logprobs[:, 0] / length_penalty(s.caps, alpha)
  return (s.step < s.caps) & (best_possible > s.finished_scores[:, num_return - 1])


def beam_step(scorer, s: BeamState, *, alpha: float, num_return: int, min_len: int,
              rules: TokenRules = TokenRules()) -> BeamState:
  """One step of beam search (what `beam_loop` repeats)."""
  B, W = s.live_seqs.shape[:2]
  active = _beam_active(s, alpha, num_return)
  previous = jnp.where(s.step == 0, 0, jnp.take(s.live_seqs, s.step - 1, axis=2))
  reads_BWS = None if s.ancestry is None else beam_caches.reads(s.ancestry, s.step)
  log_probs, cache = _next_log_probs(scorer, s, _flat(previous), _flat(s.live_seqs), rules,
                                     reads_BWS)
  if min_len:
    log_probs = jnp.where(s.step < min_len, log_probs.at[:, EOS_ID].set(NEG_INF), log_probs)
  V = log_probs.shape[-1]
  candidates_BWV = s.live_logprobs[..., None] + _unflat(log_probs, B)
  top_logprobs, top_ids = top_k(candidates_BWV.reshape(B, W * V), 2 * W)  # (ops.top_k)
  beam_ids, token_ids = top_ids // V, top_ids % V
  seqs = jnp.take_along_axis(s.live_seqs, beam_ids[..., None], axis=1)
  seqs = jax.lax.dynamic_update_slice(seqs, token_ids[..., None], (0, 0, s.step))
  is_last_B1 = (s.step + 1 >= s.caps)[:, None]  # (the sentence's own cap)
  ended = (token_ids == EOS_ID) | is_last_B1
  # Only candidates ranked within the top W may finish (the rest only matter as live ones).
  may_finish = ended & (jnp.arange(2 * W) < W)[None, :]
  new_scores = jnp.where(may_finish, top_logprobs / length_penalty(s.step + 1, alpha), NEG_INF)
  all_scores = jnp.concatenate([s.finished_scores, new_scores], axis=1)
  all_seqs = jnp.concatenate([s.finished_seqs, seqs], axis=1)
  finished_scores, keep = jax.lax.top_k(all_scores, W)
  finished_seqs = jnp.take_along_axis(all_seqs, keep[..., None], axis=1)
  # A sentence that is done keeps its finished hypotheses as they are.
  finished_scores = jnp.where(active[:, None], finished_scores, s.finished_scores)
  finished_seqs = jnp.where(active[:, None, None], finished_seqs, s.finished_seqs)
  live_candidates = jnp.where(ended, NEG_INF, top_logprobs)
  live_logprobs, keep = jax.lax.top_k(live_candidates, W)
  live_seqs = jnp.take_along_axis(seqs, keep[..., None], axis=1)
  live_beams = jnp.take_along_axis(beam_ids, keep, axis=1)
  if reads_BWS is None:  # (each hypothesis's cache: its parent's)
    cache, ancestry = beam_caches.reorder(cache, s.cache_axes, live_beams, B), None
  else:  # (its slots: its parent's, this step's included)
    ancestry = jnp.take_along_axis(reads_BWS, live_beams[..., None], axis=1)
  return s.replace(step=s.step + 1, live_seqs=live_seqs, live_logprobs=live_logprobs,
                   finished_seqs=finished_seqs, finished_scores=finished_scores,
                   cache=cache, ancestry=ancestry)


@stored_jit(static_argnames=("alpha", "num_return", "min_len", "stop_at", "rules"))
def beam_loop(scorer, state: BeamState, *, alpha: float, num_return: int, min_len: int,
              stop_at: int, rules: TokenRules = TokenRules()):
  """Beam steps while the cache has room and more than `stop_at` sentences are searching;
  returns the state and which sentences are."""
  def go_on(s):
    return (s.step < s.capacity) & (jnp.sum(_beam_active(s, alpha, num_return)) > stop_at)

  state = jax.lax.while_loop(
      go_on, lambda s: beam_step(scorer, s, alpha=alpha, num_return=num_return,
                                 min_len=min_len, rules=rules), state)
  return state, _beam_active(state, alpha, num_return)


def beam_search(scorer, inputs_BS, *, beam_size: int, alpha: float, max_len: int,
                num_return: int = 1, min_len: int = 0, prefix_BP=None, caps=None,
                unit: int = 1, counts=None, beam_impl: str = "auto",
                rules: TokenRules = TokenRules()):
  """Returns (sequences (B, W, max_len), scores (B, W)) as numpy arrays, best first;
  sequences end in EOS (or stop at their cap) and are padded with 0. The search of a
  sentence runs until its best `num_return` finished hypotheses can no longer change, so
  those are exact n-best entries. EOS cannot end a hypothesis of fewer than `min_len`
  tokens. `caps`: each sentence's own cap (<= max_len; 0 = an empty row) instead of
  max_len for all. `scorer`: the model's decoding interface (`model.stepwise`, or an
  ensemble's: `ensemble.prepare` makes either); `prefix_BP`: target
  prefixes to force (0-padded); `unit`: batch sizes stay multiples of it (the mesh's
  data-parallel size); `counts`: a Counter that adds up the work done (see `_run`);
  `beam_impl`: how hypotheses keep their self-attention caches (`beam_caches`); `rules`:
  what a hypothesis may generate next beside its scores (`rules.TokenRules`)."""
  B, W = inputs_BS.shape[0], beam_size
  seqs = np.zeros((B, W, max_len), np.int32)
  scores = np.full((B, W), NEG_INF, np.float32)

  def store(s: BeamState, sentences):
    resizing.store_rows(seqs, sentences, mesh_lib.fetch(s.finished_seqs))
    scores[sentences] = mesh_lib.fetch(s.finished_scores)

  state = beam_start(scorer, inputs_BS, _caps(caps, max_len, B), prefix_BP, beam_size=W,
                     beam_impl=beam_impl)
  advance = functools.partial(beam_loop, scorer, alpha=alpha, num_return=num_return,
                              min_len=min_len, rules=rules)
  _run(state, advance, B, unit, store, counts)
  return seqs, scores


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


@flax.struct.dataclass
class GreedyState(SearchState):
  keys: jax.Array | None          # (B, 2) sampling: each row's random key; None: argmax
  seqs: jax.Array                 # (B, C) the tokens so far
  logprobs: jax.Array             # (B,) their total log-probability
  done: jax.Array                 # (B,) ended (EOS or the cap)
  grown = ("seqs",)               # (resizing.grow: their last axis)

  @property
  def capacity(self) -> int:
    return self.seqs.shape[-1]


@stored_jit()
def greedy_start(scorer, inputs_BS, caps_B, prefix_BP, keys_B2) -> GreedyState:
  """Greedy search's (and sampling's) first program: the batch encoded, its caches made."""
  B, C = inputs_BS.shape[0], resizing.SEGMENT
  cache, cache_axes = _cache(scorer, inputs_BS, 1, C)
  return GreedyState(
      step=jnp.array(0, jnp.int32), caps=caps_B, inputs=inputs_BS, prefix=prefix_BP,
      keys=keys_B2, seqs=jnp.zeros((B, C), jnp.int32), logprobs=jnp.zeros((B,)),
      done=caps_B <= 0, cache=cache, cache_axes=cache_axes)


def _greedy_step(scorer, s: GreedyState, temperature: float, top_k: int, top_p: float,
                 rules: TokenRules):
  previous = jnp.where(s.step == 0, 0, jnp.take(s.seqs, s.step - 1, axis=1))
  log_probs, cache = _next_log_probs(scorer, s, previous, s.seqs, rules)
  if s.keys is None:
    token = jnp.argmax(log_probs, axis=-1).astype(jnp.int32)
  else:  # (each row draws from its own key: a sample depends on nothing else in the batch)
    filtered = _filter_logits(log_probs, temperature, top_k, top_p)
    token = jax.vmap(lambda key, logits: jax.random.categorical(
        jax.random.fold_in(key, s.step), logits))(s.keys, filtered).astype(jnp.int32)
  token = jnp.where(s.done, PAD_ID, token)
  logprobs = s.logprobs + jnp.where(s.done, 0.0, jnp.take_along_axis(
      log_probs, token[:, None], axis=1)[:, 0])
  seqs = jax.lax.dynamic_update_slice(s.seqs, token[:, None], (0, s.step))
  done = s.done | (token == EOS_ID) | (s.step + 1 >= s.caps)
  return s.replace(step=s.step + 1, seqs=seqs, logprobs=logprobs, done=done, cache=cache)


@stored_jit(static_argnames=("temperature", "top_k", "top_p", "stop_at", "rules"))
def greedy_loop(scorer, state: GreedyState, *, temperature: float, top_k: int, top_p: float,
                stop_at: int, rules: TokenRules = TokenRules()):
  """Greedy (or sampling) steps while the cache has room and more than `stop_at` rows are
  unfinished; returns the state and which rows are."""
  def go_on(s):
    return (s.step < s.capacity) & (jnp.sum(~s.done) > stop_at)

  state = jax.lax.while_loop(
      go_on, lambda s: _greedy_step(scorer, s, temperature, top_k, top_p, rules), state)
  return state, ~state.done


def row_keys(rng, ids) -> jax.Array:
  """A sampling key per row: `rng` folded with each row's id (e.g. its sentence's index),
  so that a row's sample does not depend on the batch it is drawn in."""
  return jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.asarray(ids, jnp.uint32))


def greedy_search(scorer, inputs_BS, *, max_len: int, rng=None, temperature: float = 1.0,
                  top_k: int = 0, top_p: float = 1.0, prefix_BP=None, caps=None,
                  unit: int = 1, counts=None, rules: TokenRules = TokenRules()):
  """Argmax decoding, or ancestral sampling when `rng` is given (with temperature, top-k and
  top-p filtering): one key, folded with each row's index, or (B, 2) keys, one per row (see
  `row_keys`). Returns (sequences (B, max_len), total log-probabilities (B,)) as numpy
  arrays. `scorer`, `prefix_BP`, `caps`, `unit`, `counts` and `rules` as for
  beam_search."""
  B = inputs_BS.shape[0]
  if rng is not None and jnp.ndim(rng) == 1:
    rng = row_keys(rng, np.arange(B))
  seqs = np.zeros((B, max_len), np.int32)
  logprobs = np.zeros((B,), np.float32)

  def store(s: GreedyState, sentences):
    resizing.store_rows(seqs, sentences, mesh_lib.fetch(s.seqs))
    logprobs[sentences] = mesh_lib.fetch(s.logprobs)

  state = greedy_start(scorer, inputs_BS, _caps(caps, max_len, B), prefix_BP, rng)
  advance = functools.partial(greedy_loop, scorer, temperature=temperature, top_k=top_k,
                              top_p=top_p, rules=rules)
  _run(state, advance, B, unit, store, counts)
  return seqs, logprobs
