"""Beam search and greedy decoding of a batch of sources, as arrays: the searches of
`slots` (decoded in flight by `scheduler`, the batch's sentences its queue) for callers
that hold token ids, not text (tests, benchmarks, the tools' own checks).

Beam search keeps `beam_size` live hypotheses per sentence; each step scores 2×beam
candidates, finishes those ending in EOS that rank within the top `beam_size` (as fairseq does,
so beam 1 is greedy), and stops when no live hypothesis can beat the best finished one under
the GNMT length penalty ((5 + length) / 6) ** alpha (Wu et al., 2016).

Every sentence has a length cap of its own (`caps`: the most tokens it may have, EOS
included): its hypotheses end there, and its search, like its output, depends on nothing else
in its batch. Both take a model's decoding interface (`model.stepwise`; one model or an
ensemble of several, one vocabulary, made ready once by `ensemble.prepare`) and can force a
target prefix per sentence (`prefix_BP`, 0-padded ids): its tokens are chosen, with their
log-probabilities counted, before the search goes on.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.decoding import scheduler, width_classes
from transformer_jax.decoding.rules import TokenRules
from transformer_jax.decoding.slots import length_penalty  # noqa: F401 (the searches' formula)
from transformer_jax.ops.masking import NEG_INF


def _caps(caps, max_len: int, rows: int) -> np.ndarray:
  """Each row's length cap: `caps` (0 = an empty row, done at once) or max_len for all."""
  if caps is None:
    return np.full((rows,), max_len, np.int32)
  caps = np.asarray(caps, np.int32)
  if caps.shape != (rows,) or caps.max(initial=0) > max_len:
    raise ValueError(f"caps must be {rows} lengths <= max_len={max_len}, got {caps}")
  return caps


def _decode(scorer, inputs_BS, max_len, caps, prefix_BP, options, keys, unit, beam_size,
            beam_impl, store):
  """The batch's sentences through one width class of B slots; `store(row, seqs, scores)`."""
  inputs = np.asarray(jax.device_get(inputs_BS))
  B, S = inputs.shape
  prefixes = None if prefix_BP is None else np.asarray(jax.device_get(prefix_BP))
  slots = -(-B // unit) * unit
  geometry = width_classes.Geometry(slots, slots, (S,), (max_len,))
  queue = collections.deque()
  for b in range(B):
    queue.append(scheduler.Sentence(
        source=inputs[b], cap=int(caps[b]), options=options,
        prefix=None if prefixes is None else prefixes[b][:max_len],
        key=None if keys is None else keys[b],
        deliver=lambda seqs, scores, b=b: store(b, seqs, scores)))
  scheduler.Decoder(scorer, geometry, beam_size, beam_impl).run(queue)


def _options(rules: TokenRules, **kw) -> dict:
  return dict(repetition_penalty=rules.repetition_penalty,
              no_repeat_ngram=rules.no_repeat_ngram_size, **kw)


def beam_search(scorer, inputs_BS, *, beam_size: int, alpha: float, max_len: int,
                num_return: int = 1, min_len: int = 0, prefix_BP=None, caps=None,
                unit: int = 1, beam_impl: str = "auto", rules: TokenRules = TokenRules()):
  """Returns (sequences (B, W, max_len), scores (B, W)) as numpy arrays, best first;
  sequences end in EOS (or stop at their cap) and are padded with 0. The search of a
  sentence runs until its best `num_return` finished hypotheses can no longer change, so
  those are exact n-best entries. EOS cannot end a hypothesis of fewer than `min_len`
  tokens. `caps`: each sentence's own cap (<= max_len; 0 = an empty row) instead of
  max_len for all. `scorer`: the model's decoding interface (`model.stepwise`, or an
  ensemble's: `ensemble.prepare` makes either); `prefix_BP`: target prefixes to force
  (0-padded); `unit`: the slots are a multiple of it (the mesh's data-parallel size);
  `beam_impl`: how hypotheses keep their self-attention caches (`beam_caches`); `rules`:
  what a hypothesis may generate next beside its scores (`rules.TokenRules`)."""
  B, W = inputs_BS.shape[0], beam_size
  seqs = np.zeros((B, W, max_len), np.int32)
  scores = np.full((B, W), NEG_INF, np.float32)

  def store(b, row_seqs, row_scores):  # (row_seqs: as long as the sentence's cap)
    seqs[b, :, :row_seqs.shape[-1]] = row_seqs
    scores[b] = row_scores

  options = _options(rules, alpha=alpha, num_return=num_return, min_len=min_len, beams=W)
  _decode(scorer, inputs_BS, max_len, _caps(caps, max_len, B), prefix_BP, options, None,
          unit, W, beam_impl, store)
  return seqs, scores


def row_keys(rng, ids) -> jax.Array:
  """A sampling key per row: `rng` folded with each row's id (e.g. its sentence's index),
  so that a row's sample does not depend on the batch it is drawn in."""
  return jax.vmap(lambda i: jax.random.fold_in(rng, i))(jnp.asarray(ids, jnp.uint32))


def greedy_search(scorer, inputs_BS, *, max_len: int, rng=None, temperature: float = 1.0,
                  top_k: int = 0, top_p: float = 1.0, prefix_BP=None, caps=None,
                  unit: int = 1, rules: TokenRules = TokenRules()):
  """Argmax decoding, or ancestral sampling when `rng` is given (with temperature, top-k and
  top-p filtering): one key, folded with each row's index, or (B, 2) keys, one per row (see
  `row_keys`). Returns (sequences (B, max_len), total log-probabilities (B,)) as numpy
  arrays. `scorer`, `prefix_BP`, `caps`, `unit` and `rules` as for beam_search."""
  B = inputs_BS.shape[0]
  if rng is not None and jnp.ndim(rng) == 1:
    rng = row_keys(rng, np.arange(B))
  seqs = np.zeros((B, max_len), np.int32)
  logprobs = np.zeros((B,), np.float32)

  def store(b, row_seqs, row_logprob):
    seqs[b, :row_seqs.shape[-1]] = row_seqs
    logprobs[b] = row_logprob

  options = _options(rules, sample=rng is not None, temperature=temperature, top_k=top_k,
                     top_p=top_p)
  keys = None if rng is None else np.asarray(jax.device_get(rng), np.uint32)
  _decode(scorer, inputs_BS, max_len, _caps(caps, max_len, B), prefix_BP, options, keys,
          unit, 0, "auto", store)
  return seqs, logprobs
