"""The rules on repeated tokens rewrite logits as CTranslate2's logits processors do (read from
its src/decoding_utils.cc: the penalty on each distinct token already in the row, l * p if
negative else l / p; a token completing an n-gram already in the row barred), checked
against a direct transcription of those loops; a barred token stays allowed where a prefix
forces it; in the search, no n-gram repeats and the penalty changes what is chosen."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.decoding.rules import TokenRules
from transformer_jax.decoding.search import beam_search, greedy_search
from transformer_jax.ops.masking import NEG_INF


def _reference(logits, rows, penalty, n):
  """CTranslate2's RepetitionPenalty then NoRepeatNgram, row by row, as its C++ loops go."""
  out = np.array(logits)
  for r, row in enumerate(rows):
    for token in set(row):  # (gathered once: a token seen twice is penalised once)
      value = logits[r, token]
      out[r, token] = value * penalty if value < 0 else value / penalty
    t = len(row)
    if n and t >= n:
      suffix = row[t - n + 1:] if n > 1 else []
      for p in range(t - n + 1):
        if list(row[p:p + n - 1]) == list(suffix):
          out[r, row[p + n - 1]] = NEG_INF
  return out


@pytest.mark.parametrize("penalty,n", [(1.3, 0), (0.7, 0), (1.0, 1), (1.0, 2), (1.2, 3)])
def test_the_rules_rewrite_logits_as_ctranslate2_does(penalty, n):
  rng = np.random.default_rng(0)
  V, C = 12, 10
  for length in range(C + 1):
    tokens = rng.integers(1, 5, size=(6, C))  # (few distinct tokens: many repeats)
    tokens[:, length:] = 0  # (positions not reached yet)
    logits = rng.normal(size=(6, V)).astype(np.float32) * 3
    got = TokenRules(penalty, n).adjust(jnp.asarray(logits), jnp.asarray(tokens), length,
                                        jnp.ones((6,), bool))
    want = _reference(logits, [list(r[:length]) for r in tokens], penalty, n)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6, err_msg=f"length {length}")


def test_a_token_forced_by_the_prefix_is_never_barred():
  tokens = jnp.array([[3, 4, 3, 0], [3, 4, 3, 0]])
  logits = jnp.zeros((2, 6))
  got = TokenRules(1.0, 2).adjust(logits, tokens, 3, jnp.array([True, False]))
  assert got[0, 4] == NEG_INF and got[1, 4] == 0  # ("3 4" seen: 4 barred unless forced)


def _repeats(ids, n):
  grams = [tuple(ids[i:i + n]) for i in range(len(ids) - n + 1)]
  return len(grams) - len(set(grams))


@pytest.fixture(scope="module")
def tiny_model():
  cfg, model, state = helpers.tiny_setup()
  inputs = jax.random.randint(jax.random.PRNGKey(1), (8, 12), 3, cfg.model.vocab_size)
  return model, state.params, inputs


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_in_the_search_no_ngram_repeats_and_the_penalty_changes_the_choice(tiny_model, search):
  model, params, inputs = tiny_model

  def run(rules):
    if search == "greedy":
      return greedy_search(prepare(model, params), inputs, max_len=24, rules=rules)[0]
    return beam_search(prepare(model, params), inputs, beam_size=3, alpha=0.6, max_len=24,
                       rules=rules)[0][:, 0]

  plain = run(TokenRules())
  assert sum(_repeats([t for t in row if t], 2) for row in plain) > 0  # (an untrained model)
  for row in run(TokenRules(no_repeat_ngram_size=2)):
    assert _repeats([t for t in row if t], 2) == 0, row
  assert (run(TokenRules(repetition_penalty=5.0)) != plain).any()
