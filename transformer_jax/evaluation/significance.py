"""Is one system better than another on a test set, or is the difference chance? Paired
bootstrap resampling (Koehn, 2004) and paired approximate randomization (Riezler and Maxwell,
2005), as sacreBLEU computes them (`sacrebleu --paired-bs / --paired-ar`), for single runs and
for populations of runs (seeds).

A system is one or more sets of translations of the same sources (a population's members).
Its score in the tests is the corpus score of all its translations pooled: each sentence's
sufficient statistics (BLEU's n-gram matches and lengths, chrF's character and word n-grams)
summed over the members, the corpus of all K x n translations, so that a resample or a swap
of sentence j takes every member's translation of j. (Approximate randomization between
systems of K_a and K_b members swaps their sums scaled to lcm(K_a, K_b) members each: counts
stay integers, as sacreBLEU's length statistics must, and a sentence weighs the same on
either side.) For one member this is sacreBLEU's statistic, and with the same seed the
same p-value and interval (tested against the `sacrebleu` command). The members' own scores,
their mean and standard deviation, are reported beside it: the seed noise the test does not
see (the test resamples sentences; the seeds are what they are).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import sacrebleu

from transformer_jax.errors import DataError

DEFAULT_SEED = 12345  # sacreBLEU's (SACREBLEU_SEED)
DEFAULT_SAMPLES = {"bs": 1000, "ar": 10000}  # sacreBLEU's


@dataclasses.dataclass(frozen=True)
class Result:
  """A system's score on a metric and, against the baseline, the test's p-value; with the
  bootstrap's mean and the half-width of its 95% interval (`mean` ± `ci`), and its members'
  own scores."""
  score: float
  members: tuple[float, ...]
  mean: float | None = None
  ci: float | None = None
  p_value: float | None = None

  @property
  def member_mean(self) -> float:
    return float(np.mean(self.members))

  @property
  def member_std(self) -> float:
    """The members' sample standard deviation (0 for one member)."""
    return float(np.std(self.members, ddof=1)) if len(self.members) > 1 else 0.0


def metrics() -> dict:
  """The metrics the tests run, configured as `scoring.score` and sacreBLEU's command."""
  return {"BLEU": sacrebleu.BLEU(), "chrF2": sacrebleu.CHRF()}


def _statistics(metric, system: list[list[str]], references: list[str]):
  """(pooled per-sentence statistics (n, S): the members' sums, exact in float64; the corpus
  score of the pool, each member's corpus score)."""
  per_member = [np.asarray(metric._extract_corpus_statistics(hyps, [references]), np.float64)
                for hyps in system]
  pooled = np.sum(per_member, axis=0)
  return pooled, _score(metric, pooled.sum(0)), tuple(_score(metric, s.sum(0))
                                                      for s in per_member)


def _score(metric, stats) -> float:
  return float(metric._compute_score_from_stats(stats).score)


def _resampled(metric, stats, indices) -> np.ndarray:
  """The scores of the resamples `indices` (k, n) of the sentences, as sacreBLEU computes them:
  summed in float32, and chrF's scores kept in float32 (its mean and interval too)."""
  stats = stats.astype(np.float32)
  return np.array([metric._compute_score_from_stats(s.sum(0)).score for s in stats[indices]])


def _p_value(samples: np.ndarray, observed: float) -> float:
  """(samples at least as large as the observed difference + 1) / (n + 1), multeval's rule.
  sacreBLEU counts the samples strictly larger. The two differ only where samples tie with
  the observed difference: a bootstrap's centred differences hardly ever do, unless the
  systems are the same (all 0: sacreBLEU's p = 1/1001, "significant"; here 1); approximate
  randomization's do whenever a trial swaps none or all of the m sentences whose statistics
  differ, a chance of 2^(1 - m) per trial: here those trials count as at least as large."""
  return (np.sum(samples >= observed).item() + 1) / (len(samples) + 1)


def _interval(scores: np.ndarray) -> tuple[float, float]:
  """sacreBLEU's estimate_ci: the mean, and half the range between the 2.5% quantiles."""
  scores = np.sort(scores)
  low = len(scores) // 40
  return float(scores.mean()), float(0.5 * (scores[len(scores) - low - 1] - scores[low]))


def _check(baseline, system, references):
  for name, sets in (("baseline", baseline), ("system", system)):
    for i, hyps in enumerate(sets):
      if len(hyps) != len(references):
        raise DataError(f"the {name}'s translations{f' (member {i})' if len(sets) > 1 else ''}"
                         f" are {len(hyps)} lines for {len(references)} references")


def paired_bootstrap(baseline: list[list[str]], system: list[list[str]], references: list[str],
                     samples: int = DEFAULT_SAMPLES["bs"], seed: int | None = DEFAULT_SEED,
                     only: str = "") -> dict[str, tuple[Result, Result]]:
  """Per metric, (baseline, system) with the system's p-value: the chance that a difference at
  least as large as the observed one arises from resampling the test set's sentences, under
  the hypothesis that the systems are equal (the resampled differences, centred on their
  mean). Both get the bootstrap's mean and 95% interval. `only`: that metric alone ("BLEU",
  "chrF2")."""
  _check(baseline, system, references)
  # (as sacreBLEU draws them: one generator per system, the same seed, the same draws)
  n = len(references)
  indices = np.random.default_rng(seed).choice(n, size=(samples, n), replace=True)
  out = {}
  for name, metric in metrics().items():
    if only and name != only:
      continue
    base_stats, base_score, base_members = _statistics(metric, baseline, references)
    sys_stats, sys_score, sys_members = _statistics(metric, system, references)
    base_samples = _resampled(metric, base_stats, indices)
    sys_samples = _resampled(metric, sys_stats, indices)
    differences = np.abs(sys_samples - base_samples)
    p = _p_value(differences - differences.mean(), abs(base_score - sys_score))
    out[name] = (Result(base_score, base_members, *_interval(base_samples)),
                 Result(sys_score, sys_members, *_interval(sys_samples), p_value=p))
  return out


def paired_randomization(baseline: list[list[str]], system: list[list[str]],
                         references: list[str], samples: int = DEFAULT_SAMPLES["ar"],
                         seed: int | None = DEFAULT_SEED, interval_samples: int = 1000
                         ) -> dict[str, tuple[Result, Result]]:
  """Per metric, (baseline, system) with the system's p-value: the chance that swapping each
  sentence's translations between the systems with probability 1/2 gives a difference at
  least as large as the observed one. `interval_samples` > 0: bootstrap means and 95%
  intervals as well (sacreBLEU's --paired-ar-confidence-n)."""
  _check(baseline, system, references)
  n = len(references)
  rng = np.random.default_rng(seed)
  keep = rng.integers(2, size=(samples, n), dtype=bool)
  indices = (rng.choice(n, size=(interval_samples, n), replace=True)
             if interval_samples > 0 else None)
  base_indices = (np.random.default_rng(seed).choice(n, size=(interval_samples, n),
                                                     replace=True)
                  if interval_samples > 0 else None)
  out = {}
  for name, metric in metrics().items():
    base_stats, base_score, base_members = _statistics(metric, baseline, references)
    sys_stats, sys_score, sys_members = _statistics(metric, system, references)
    common = math.lcm(len(baseline), len(system))
    base_weighed = base_stats * (common // len(baseline))
    sys_weighed = sys_stats * (common // len(system))
    shuffled_a = keep @ base_weighed + ~keep @ sys_weighed
    shuffled_b = ~keep @ base_weighed + keep @ sys_weighed
    differences = np.abs(np.array([_score(metric, a) for a in shuffled_a])
                         - np.array([_score(metric, b) for b in shuffled_b]))
    observed = abs(_score(metric, base_weighed.sum(0)) - _score(metric, sys_weighed.sum(0)))
    p = _p_value(differences, observed)
    base_ci = sys_ci = (None, None)
    if indices is not None:
      base_ci = _interval(_resampled(metric, base_stats, base_indices))
      sys_ci = _interval(_resampled(metric, sys_stats, indices))
    out[name] = (Result(base_score, base_members, *base_ci),
                 Result(sys_score, sys_members, *sys_ci, p_value=p))
  return out
