"""Paired significance tests: equal to sacreBLEU's own command on the same files and seed, and
for populations, the pooled statistic of all their members' translations."""

import gzip
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

from tests.helpers import run_tool
from transformer_jax.cli import compare
from transformer_jax.errors import DataError
from transformer_jax.evaluation import significance

CORPUS = Path(__file__).resolve().parents[3] / "transformer_jax" / "corpora" / "multi30k"
SEED = 7  # (not sacreBLEU's default: the seed is passed, not assumed)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
  """300 Multi30k validation references and two systems that drop 30% and 27% of their words
  (their BLEU 42.5 and 48.0: a difference a test should find)."""
  folder = tmp_path_factory.mktemp("significance")
  refs = gzip.open(CORPUS / "val.en.gz", "rt").read().splitlines()[:300]

  def dropping(rate, seed):
    r = random.Random(seed)
    return [" ".join(w for w in line.split() if r.random() > rate) for line in refs]
  for name, lines in [("ref", refs), ("a", dropping(0.3, 1)), ("b", dropping(0.27, 2)),
                      ("c", dropping(0.3, 3))]:
    (folder / f"{name}.txt").write_text("\n".join(lines) + "\n")
  return folder


def _lines(path):
  return path.read_text().splitlines()


def _sacrebleu(files, test):
  """sacreBLEU's command on files a (baseline) and b: the numbers of its table's rows (the
  baseline's, b's, b's p-values), metric by metric."""
  out = subprocess.run(
      [sys.executable, "-m", "sacrebleu", str(files / "ref.txt"), "-i", str(files / "a.txt"),
       str(files / "b.txt"), f"--paired-{test}", "-m", "bleu", "chrf", "-f", "text", "-w", "6"],
      capture_output=True, text=True, check=True, env={"SACREBLEU_SEED": str(SEED)}).stdout
  rows = [line.split("│")[2:] for line in out.splitlines() if line.startswith("│")
          and ("a.txt" in line or "b.txt" in line or "p =" in line)]
  return [re.findall(r"\d+\.\d+", "|".join(row)) for row in rows]


@pytest.mark.parametrize("test", ["bs", "ar"])
def test_p_values_means_and_intervals_equal_sacrebleus_command(files, test):
  base_row, sys_row, p_row = _sacrebleu(files, test)
  ours = (significance.paired_bootstrap if test == "bs" else significance.paired_randomization)(
      [_lines(files / "a.txt")], [_lines(files / "b.txt")], _lines(files / "ref.txt"),
      seed=SEED, **({} if test == "bs" else {"interval_samples": 0}))
  for i, metric in enumerate(["BLEU", "chrF2"]):
    baseline, system = ours[metric]
    if test == "bs":  # rows: score (mean ± ci) per metric, 6 decimals
      assert [f"{x:.6f}" for x in (baseline.score, baseline.mean, baseline.ci)] == \
          base_row[3 * i:3 * i + 3]
      assert [f"{x:.6f}" for x in (system.score, system.mean, system.ci)] == \
          sys_row[3 * i:3 * i + 3]
    else:
      assert f"{system.score:.6f}" == sys_row[i]
    assert f"{system.p_value:.4f}" == p_row[i]
    assert system.p_value < 0.05


def test_the_same_system_twice_is_not_significant_and_a_near_twin_is_not_either(files):
  a, c, refs = _lines(files / "a.txt"), _lines(files / "c.txt"), _lines(files / "ref.txt")
  for test in (significance.paired_bootstrap, significance.paired_randomization):
    assert test([a], [a], refs, seed=SEED)["BLEU"][1].p_value == 1.0
    assert test([a], [c], refs, seed=SEED)["BLEU"][1].p_value > 0.05


def test_a_population_is_scored_on_its_members_pooled(files):
  a, b, refs = _lines(files / "a.txt"), _lines(files / "b.txt"), _lines(files / "ref.txt")
  baseline, system = significance.paired_bootstrap([a, b], [b], refs, seed=SEED)["BLEU"]
  pooled = sacrebleu.BLEU().corpus_score(a + b, [refs + refs]).score
  assert baseline.score == pytest.approx(pooled, abs=1e-9)
  members = [sacrebleu.BLEU().corpus_score(h, [refs]).score for h in (a, b)]
  assert baseline.members == pytest.approx(members)
  assert baseline.member_std == pytest.approx(np.std(members, ddof=1))
  with pytest.raises(DataError, match=r"the system's translations are 299 lines for 300"):
    significance.paired_bootstrap([a], [b[:-1]], refs)


def test_the_tool_prints_each_system_against_the_baseline(files):
  status, out, err = run_tool(
      compare.main, f"--baseline={files / 'a.txt'},{files / 'c.txt'}",
      f"--system={files / 'b.txt'}", f"--reference={files / 'ref.txt'}", f"--seed={SEED}")
  assert status == 0, err
  lines = out.splitlines()
  assert lines[0].startswith("paired bootstrap resampling, 1000 resamples, seed 7, 300")
  assert "[2 members: " in lines[1] and re.search(r"p = 0\.0\d+\*", lines[2])
