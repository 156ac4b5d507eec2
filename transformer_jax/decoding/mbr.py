"""Minimum-Bayes-risk decoding (Kumar & Byrne 2004; Eikema & Aziz 2020): of a sentence's
candidate translations (the beam's n-best or samples), the one with the highest expected
utility against all of them, the utility a sentence-level sacreBLEU metric.

The utilities are sacreBLEU's sentence chrF and sentence BLEU (their defaults: chrF with
character 6-grams and beta 2; BLEU on 13a tokens with exp smoothing and effective order),
computed for all N x N pairs at once: each candidate's n-grams are counted once (sacreBLEU's
own extraction), the pairwise clipped matches are numpy minima over count matrices, and the
scores follow sacreBLEU's formulas (chrF's in the same floating-point operations, BLEU's by
sacreBLEU's own `compute_bleu`), so they equal `sacrebleu.sentence_chrf/bleu(h, [y])`.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import sacrebleu
from sacrebleu.metrics import helpers

CHAR_ORDER, BETA, WORD_ORDER = 6, 2, 4
_TOKENIZE_13A = sacrebleu.BLEU().tokenizer


def _count_matrices(counters: list[Counter], orders: int, order_of) -> list[np.ndarray]:
  """Per n-gram order, the (N, G) matrix of each candidate's count of each n-gram."""
  grams: list[dict] = [{} for _ in range(orders)]
  for counter in counters:
    for gram in counter:
      table = grams[order_of(gram) - 1]
      table.setdefault(gram, len(table))
  matrices = [np.zeros((len(counters), len(g)), np.int64) for g in grams]
  for i, counter in enumerate(counters):
    for gram, count in counter.items():
      n = order_of(gram) - 1
      matrices[n][i, grams[n][gram]] = count
  return matrices


def _matches(matrix: np.ndarray) -> np.ndarray:
  """(N, N) clipped matches: sum over n-grams of min(count in h, count in y)."""
  return np.minimum(matrix[:, None, :], matrix[None, :, :]).sum(axis=-1)


def chrf_matrix(candidates: list[str]) -> np.ndarray:
  """(N, N) sentence chrF of candidate h (row) against candidate y (column) as reference."""
  counters = []
  for text in candidates:
    per_order = helpers.extract_all_char_ngrams(text, CHAR_ORDER)
    counters.append(Counter({gram: c for order in per_order for gram, c in order.items()}))
  eps, factor = 1e-16, BETA ** 2
  avg_prec = avg_rec = 0.0
  effective = 0
  for matrix in _count_matrices(counters, CHAR_ORDER, len):
    total = matrix.sum(axis=1)
    n_ref = np.broadcast_to(total[None, :], (len(candidates),) * 2)
    n_hyp = np.where(n_ref > 0, total[:, None], 0)  # (no hits counted without a reference)
    n_match = _matches(matrix)
    prec = np.where(n_hyp > 0, n_match / np.maximum(n_hyp, 1), eps)
    rec = np.where(n_ref > 0, n_match / np.maximum(n_ref, 1), eps)
    counted = (n_hyp > 0) & (n_ref > 0)
    avg_prec = avg_prec + np.where(counted, prec, 0.0)
    avg_rec = avg_rec + np.where(counted, rec, 0.0)
    effective = effective + counted
  avg_prec = np.where(effective > 0, avg_prec / np.maximum(effective, 1), 0.0)
  avg_rec = np.where(effective > 0, avg_rec / np.maximum(effective, 1), 0.0)
  with np.errstate(divide="ignore", invalid="ignore"):
    score = (1 + factor) * avg_prec * avg_rec
    score = score / ((factor * avg_prec) + avg_rec)
  return np.where(avg_prec + avg_rec != 0, 100 * score, 0.0)


def bleu_matrix(candidates: list[str]) -> np.ndarray:
  """(N, N) sentence BLEU of candidate h (row) against candidate y (column) as reference."""
  counters, lengths = zip(*(helpers.extract_all_word_ngrams(_TOKENIZE_13A(t.rstrip()), 1,
                                                            WORD_ORDER) for t in candidates))
  matrices = _count_matrices(list(counters), WORD_ORDER, len)
  correct = np.stack([_matches(m) for m in matrices], axis=-1)  # (N, N, orders)
  total = np.stack([m.sum(axis=1) for m in matrices], axis=-1)  # (N, orders)
  out = np.zeros((len(candidates),) * 2)
  for h, r in np.ndindex(out.shape):
    out[h, r] = sacrebleu.BLEU.compute_bleu(
        correct[h, r].tolist(), total[h].tolist(), lengths[h], lengths[r], smooth_method="exp",
        effective_order=True).score
  return out


UTILITIES = {"chrf": chrf_matrix, "bleu": bleu_matrix}


def expected_utilities(candidates: list[str], utility: str) -> list[float]:
  """For each candidate h: the mean over the other candidates y of u(h, y), each weighted
  equally (samples are drawn from the model; an n-best list is treated the same way). A
  candidate is not its own pseudo-reference: u(h, h) is 100 for chrF but below 100 for BLEU
  on a short h (no 4-grams), which would bias the choice against short candidates; a
  duplicate candidate still counts as another."""
  if len(candidates) < 2:
    return [0.0] * len(candidates)
  # (summed in order, as a Python sum: the same floats as summing sacreBLEU's scores)
  return [sum(u for j, u in enumerate(row) if j != i) / (len(row) - 1)
          for i, row in enumerate(UTILITIES[utility](candidates).tolist())]


def mbr_chosen(hypotheses: list, utility: str, keep: int) -> list:
  """The first `keep` of `hypotheses` (each with its `text`) by expected utility
  (`mbr_order`), as they are otherwise (their scores kept)."""
  return [hypotheses[i] for i in mbr_order([h.text for h in hypotheses], utility)][:keep]


def mbr_order(candidates: list[str], utility: str) -> list[int]:
  """Indices of the candidates, highest expected utility first (ties: the earlier one)."""
  if len(candidates) < 2:
    return list(range(len(candidates)))
  utilities = expected_utilities(candidates, utility)
  return sorted(range(len(candidates)), key=lambda i: (-utilities[i], i))
