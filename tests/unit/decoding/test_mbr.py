"""Minimum-Bayes-risk choice on a hand-made candidate set, and MBR and forced prefixes
through the set decoder on the tiny model."""

import dataclasses

import pytest
import sacrebleu

from tests import helpers
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.decoding.batches import translate_nbest
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.decoding.mbr import UTILITIES, expected_utilities, mbr_order

# The first candidate (the model's best) is the outlier; the consensus comes third.
CANDIDATES = ["the dog sleeps", "a man rides a bike", "a man rides a red bike",
              "a man is riding a red bike", "a man rides a red bicycle"]


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_mbr_picks_the_expected_utility_argmax_not_the_first_candidate(utility):
  metric = {"chrf": sacrebleu.sentence_chrf, "bleu": sacrebleu.sentence_bleu}[utility]
  expected = [sum(metric(h, [y]).score for y in CANDIDATES if y is not h) / (len(CANDIDATES) - 1)
              for h in CANDIDATES]
  assert expected_utilities(CANDIDATES, utility) == pytest.approx(expected)
  order = mbr_order(CANDIDATES, utility)
  assert order[0] == max(range(len(CANDIDATES)), key=expected.__getitem__)
  assert CANDIDATES[order[0]] == "a man rides a red bike"  # the consensus, not the first-best
  assert order[-1] == 0  # the outlier last
  assert [expected[i] for i in order] == sorted(expected, reverse=True)
  assert mbr_order(["only one"], utility) == [0]


@pytest.mark.parametrize("utility", ["chrf", "bleu"])
def test_the_pairwise_utilities_equal_sacrebleus_sentence_scores(utility):
  metric = {"chrf": sacrebleu.sentence_chrf, "bleu": sacrebleu.sentence_bleu}[utility]
  candidates = CANDIDATES + ["", "bike", "a a a a a a", "A man, rides a red bike!  "]
  matrix = UTILITIES[utility](candidates)
  assert matrix.tolist() == [[metric(h, [y]).score for y in candidates] for h in candidates]


@pytest.fixture(scope="module")
def tiny_model():
  cfg, model, state = helpers.tiny_setup()
  return cfg, model, state.params


def test_mbr_through_the_decoder_reorders_the_beams_n_best(tiny_model, tiny_tokenizer):
  cfg, model, params = tiny_model
  tok = Tokenizer.load(tiny_tokenizer)
  eval_set = EvalSet.from_pairs(["ein mann fährt fahrrad", "zwei hunde spielen im schnee"],
                                [], tok)
  beam = dataclasses.replace(cfg.decode, beam_size=4, nbest=4, max_length=8, max_length_a=0,
                             max_length_b=8)
  nbest = translate_nbest(prepare(model, params), eval_set, tok, beam)
  mbr = dataclasses.replace(beam, nbest=1, mbr="chrf", mbr_candidates=4)
  chosen = translate_nbest(prepare(model, params), eval_set, tok, mbr)
  firsts = []
  for candidates, (best,) in zip(nbest, chosen):
    texts = [h.text for h in candidates]
    firsts.append(mbr_order(texts, "chrf")[0])
    assert best == candidates[firsts[-1]]
  assert any(firsts), firsts  # (a reordering happened: a no-op MBR would fail the loop)


def test_forced_prefixes_start_the_translations(tiny_model, tiny_tokenizer):
  cfg, model, params = tiny_model
  tok = Tokenizer.load(tiny_tokenizer)
  sources = ["ein mann fährt fahrrad", "zwei hunde spielen", "eine frau"]
  eval_set = EvalSet.from_pairs(sources, [], tok).with_prefixes(
      ["a young man", "", "two"], tok)
  plain = translate_nbest(prepare(model, params), EvalSet.from_pairs(sources, [], tok), tok,
                          cfg.decode)
  out = translate_nbest(prepare(model, params), eval_set, tok, cfg.decode)
  assert out[0][0][0].startswith("a young man") and out[2][0][0].startswith("two")
  assert out[1] == plain[1]  # (no prefix: as without)
  with pytest.raises(ValueError, match="2 target prefixes for 3 sentences"):
    EvalSet.from_pairs(sources, [], tok).with_prefixes(["a", "b"], tok)
