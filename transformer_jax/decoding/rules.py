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

A barred token stays allowed where the row's forced prefix chooses it.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from transformer_jax.config.sections import DecodeConfig
from transformer_jax.ops.masking import NEG_INF


@dataclasses.dataclass(frozen=True)
class TokenRules:
  """The rules of `config.decode` (each off at its default); hashable: a static argument of
  the search's programs."""
  repetition_penalty: float = 1.0
  no_repeat_ngram_size: int = 0

  @classmethod
  def of(cls, cfg: DecodeConfig) -> TokenRules:
    return cls(repetition_penalty=cfg.repetition_penalty,
               no_repeat_ngram_size=cfg.no_repeat_ngram_size)

  @property
  def active(self) -> bool:
    return self.repetition_penalty != 1.0 or self.no_repeat_ngram_size > 0

  def adjust(self, logits_NV, tokens_NC, length, free_N):
    """`logits_NV` rewritten by the rules for rows whose first `length` tokens are
    `tokens_NC`'s; `free_N`: the rows that choose their token (not forced by a prefix)."""
    if self.repetition_penalty != 1.0:
      used_NV = _marked(tokens_NC, jnp.arange(tokens_NC.shape[1]) < length, logits_NV.shape)
      p = self.repetition_penalty
      logits_NV = jnp.where(used_NV, jnp.where(logits_NV < 0, logits_NV * p, logits_NV / p),
                            logits_NV)
    if self.no_repeat_ngram_size > 0:
      barred_NV = _repeating(tokens_NC, length, self.no_repeat_ngram_size, logits_NV.shape)
      logits_NV = jnp.where(barred_NV & free_N[:, None], NEG_INF, logits_NV)
    return logits_NV


def _marked(ids_NC, valid_NC, shape):
  """(N, V) True at each row's ids where valid."""
  rows_N1 = jnp.arange(shape[0])[:, None]
  return jnp.zeros(shape, bool).at[rows_N1, ids_NC].max(valid_NC)


def _repeating(tokens_NC, length, n: int, shape):
  """(N, V) the tokens that would complete an n-gram already among each row's first `length`
  tokens: those that followed an earlier occurrence of the row's last n - 1 tokens."""
  C = tokens_NC.shape[1]
  start_C = jnp.arange(C)  # (an occurrence starting at p, followed by token p + n - 1)
  matches_NC = jnp.ones(tokens_NC.shape, bool)
  for j in range(n - 1):  # (the last n - 1 tokens are at length - n + 1 .. length - 1)
    shifted_NC = jnp.roll(tokens_NC, -j, axis=1)  # (position p holds token p + j)
    last_N1 = jnp.take(tokens_NC, jnp.clip(length - n + 1 + j, 0, C - 1), axis=1)[:, None]
    matches_NC &= shifted_NC == last_N1
  follows_NC = jnp.roll(tokens_NC, -(n - 1), axis=1)
  valid_NC = (start_C + n <= length)[None, :] & matches_NC
  return _marked(follows_NC, valid_NC, shape)
