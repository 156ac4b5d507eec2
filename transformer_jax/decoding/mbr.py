"""Minimum-Bayes-risk decoding (Kumar & Byrne 2004; Eikema & Aziz 2020): of a sentence's
candidate translations (the beam's n-best or samples), the one with the highest expected
utility against all of them, the utility a sentence-level sacreBLEU metric."""

from __future__ import annotations

import sacrebleu

UTILITIES = {"chrf": lambda hyp, ref: sacrebleu.sentence_chrf(hyp, [ref]).score,
             "bleu": lambda hyp, ref: sacrebleu.sentence_bleu(hyp, [ref]).score}


def expected_utilities(candidates: list[str], utility: str) -> list[float]:
  """For each candidate h: the mean over the candidates y (itself included) of u(h, y), each
  candidate weighted equally (samples are drawn from the model; an n-best list is treated
  the same way)."""
  score = UTILITIES[utility]
  return [sum(score(h, y) for y in candidates) / len(candidates) for h in candidates]


def mbr_order(candidates: list[str], utility: str) -> list[int]:
  """Indices of the candidates, highest expected utility first (ties: the earlier one)."""
  if len(candidates) < 2:
    return list(range(len(candidates)))
  utilities = expected_utilities(candidates, utility)
  return sorted(range(len(candidates)), key=lambda i: (-utilities[i], i))
