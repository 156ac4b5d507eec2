"""Rules on what a row may generate next, beside its model's scores: the decoding options that
rewrite each step's logits before the softmax, as CTranslate2's logits processors do (its
`src/decoding_utils.cc`), so that both engines honour them alike.

A rule sees each row's tokens so far (a beam hypothesis's or a greedy row's: its forced
prefix included, the start token not) and rewrites its logits (an ensemble's, each model's
before its log-softmax: `model.stepwise.StepwiseModel.step`'s `adjust`):

- `repetition_penalty` p (Keskar et al., 2019): each token already in the row, counted once,
  has its logit l made l * p if negative, else l / p;
- `no_repeat_ngram_size` n: a token that would complete an n-gram already in the row is
  barred (from the row's n-th token on; n = 1: no token twice).

A barred token stays allowed where the row's forced prefix chooses it. (Sampling's own
filters, temperature, top-k and top-p: `sampling_filter`.) Both are runtime
values, one per row (sentences decoding side by side may ask different ones); a step of rows
that all have them off skips their work.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from transformer_jax.config.sections import DecodeConfig
from transformer_jax.ops.masking import NEG_INF


def sampling_filter(logits_NV, temperature_N, top_k_N, top_p_N):
  """Temperature, then top-k (0: all), then nucleus (top-p) filtering, each row its own;
  removed tokens get NEG_INF."""
  logits_NV = logits_NV / temperature_N[:, None]
  sorted_NV = -jnp.sort(-logits_NV, axis=-1)
  kth_N1 = jnp.take_along_axis(sorted_NV, jnp.maximum(top_k_N - 1, 0)[:, None], axis=-1)
  logits_NV = jnp.where((top_k_N[:, None] > 0) & (logits_NV < kth_N1), NEG_INF, logits_NV)
  sorted_NV = jnp.where((top_k_N[:, None] > 0) & (sorted_NV < kth_N1), NEG_INF, sorted_NV)
  cumulative = jnp.cumsum(jax.nn.softmax(sorted_NV, axis=-1), axis=-1)
  # The smallest prefix whose probability reaches top_p: keep tokens up to that one.
  cutoff_index = jnp.sum(cumulative < top_p_N[:, None], axis=-1, keepdims=True)
  cutoff = jnp.take_along_axis(sorted_NV, jnp.minimum(cutoff_index, sorted_NV.shape[1] - 1),
                               axis=-1)
  return jnp.where((top_p_N[:, None] < 1.0) & (logits_NV < cutoff), NEG_INF, logits_NV)


MAX_NGRAM = 16  # the largest no_repeat_ngram_size (config.decode's declared maximum)


@dataclasses.dataclass(frozen=True)
class TokenRules:
  """The rules of `config.decode` (each off at its default)."""
  repetition_penalty: float = 1.0
  no_repeat_ngram_size: int = 0

  @classmethod
  def of(cls, cfg: DecodeConfig) -> TokenRules:
    return cls(repetition_penalty=cfg.repetition_penalty,
               no_repeat_ngram_size=cfg.no_repeat_ngram_size)

  def adjust(self, logits_NV, tokens_NC, length, free_N):
    """`adjust_rows` with these rules for every row and one `length` for all."""
    N = logits_NV.shape[0]
    return adjust_rows(logits_NV, tokens_NC, jnp.full((N,), length, jnp.int32), free_N,
                       jnp.full((N,), self.repetition_penalty, jnp.float32),
                       jnp.full((N,), self.no_repeat_ngram_size, jnp.int32))


def adjust_rows(logits_NV, tokens_NC, length_N, free_N, penalty_N, ngram_N):
  """`logits_NV` rewritten by each row's rules (`penalty_N`: its repetition penalty, 1 = off;
  `ngram_N`: its no_repeat_ngram_size, 0 = off) for rows whose first `length_N` tokens are
  `tokens_NC`'s; `free_N`: the rows that choose their token (not forced by a prefix)."""
  def rewritten(logits_NV):
    used_NV = _marked(tokens_NC, jnp.arange(tokens_NC.shape[1])[None, :] < length_N[:, None],
                      logits_NV.shape)
    p_N1 = penalty_N[:, None]
    logits_NV = jnp.where(used_NV & (p_N1 != 1.0),
                          jnp.where(logits_NV < 0, logits_NV * p_N1, logits_NV / p_N1),
                          logits_NV)
    barred_NV = _repeating(tokens_NC, length_N, ngram_N, logits_NV.shape)
    return jnp.where(barred_NV & free_N[:, None], NEG_INF, logits_NV)
  return jax.lax.cond(jnp.any(penalty_N != 1.0) | jnp.any(ngram_N > 0), rewritten,
                      lambda x: x, logits_NV)


def _marked(ids_NC, valid_NC, shape):
  """(N, V) True at each row's ids where valid."""
  rows_N1 = jnp.arange(shape[0])[:, None]
  return jnp.zeros(shape, bool).at[rows_N1, ids_NC].max(valid_NC)


def _repeating(tokens_NC, length_N, n_N, shape):
  """(N, V) the tokens that would complete an n-gram (n: the row's `n_N`, 0 = none) already
  among each row's first `length_N` tokens: those that followed an earlier occurrence of the
  row's last n - 1 tokens."""
  C = tokens_NC.shape[1]
  start_1C = jnp.arange(C)[None, :]  # (an occurrence starting at p, followed by token p + n - 1)
  n_N1, length_N1 = n_N[:, None], length_N[:, None]

  def match(j, matches_NC):  # (the last n - 1 tokens are at length - n + 1 .. length - 1)
    shifted_NC = jnp.take_along_axis(tokens_NC, (start_1C + j) % C, axis=1)  # (p: token p + j)
    last_N1 = jnp.take_along_axis(tokens_NC, jnp.clip(length_N1 - n_N1 + 1 + j, 0, C - 1),
                                  axis=1)
    return matches_NC & ((j >= n_N1 - 1) | (shifted_NC == last_N1))
  # (a loop, not unrolled: a program's compile time grows with each copy)
  matches_NC = jax.lax.fori_loop(0, MAX_NGRAM - 1, match, jnp.ones(tokens_NC.shape, bool))
  follows_NC = jnp.take_along_axis(tokens_NC, (start_1C + n_N1 - 1) % C, axis=1)
  valid_NC = (n_N1 > 0) & (start_1C + n_N1 <= length_N1) & matches_NC
  return _marked(follows_NC, valid_NC, shape)
