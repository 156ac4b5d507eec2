"""Corpus BLEU and chrF with sacreBLEU, with their signatures (Post, 2018)."""

from __future__ import annotations

import dataclasses

import sacrebleu


@dataclasses.dataclass(frozen=True)
class Score:
  bleu: float
  bleu_signature: str
  chrf: float
  chrf_signature: str

  def __str__(self):
    return (f"BLEU {self.bleu:.2f} ({self.bleu_signature})  "
            f"chrF {self.chrf:.2f} ({self.chrf_signature})")


def score(hypotheses: list[str], references: list[str]) -> Score:
  """Corpus sacreBLEU (cased, 13a tokenizer) and chrF of detokenized hypotheses vs references."""
  if len(hypotheses) != len(references):
    raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
  bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
  b = bleu.corpus_score(hypotheses, [references])
  c = chrf.corpus_score(hypotheses, [references])
  return Score(b.score, str(bleu.get_signature()), c.score, str(chrf.get_signature()))


def lowercase_bleu(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
  """Lowercased BLEU (13a-tokenized), for comparison with papers that report it."""
  bleu = sacrebleu.BLEU(lowercase=True)
  return bleu.corpus_score(hypotheses, [references]).score, str(bleu.get_signature())
