"""Cleaning rules for training pairs, applied when a local corpus is prepared
(`config.data.cleaning`), and their report.

Each pair is checked against the rules in `CleaningConfig.RULES` order and dropped by the
first it breaks, which counts it (and keeps its first few as examples). The per-pair rules
are pure functions of the pair (`broken_rule`), so a distributed preparation
(`data.apache_beam_prep`) applies them alike; the duplicate rule keeps a pair's first
occurrence in file order among the pairs that passed the rules before it. The report goes to
`cleaning.json` beside the prepared data and into the log, counts and examples of every rule.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from transformer_jax import atomic
from transformer_jax.config.corpora import CleaningConfig

log = logging.getLogger(__name__)

REPORT = "cleaning.json"
BEFORE_DUPLICATES = CleaningConfig.RULES[:CleaningConfig.RULES.index("duplicates")]
AFTER_DUPLICATES = CleaningConfig.RULES[CleaningConfig.RULES.index("duplicates") + 1:]


def _letter_fraction(text: str) -> float:
  chars = [c for c in text if not c.isspace()]
  return sum(c.isalpha() for c in chars) / len(chars) if chars else 0.0


def _breaks(rule: str, a: str, b: str, cfg: CleaningConfig) -> bool:
  if rule == "empty":
    return not a.strip() or not b.strip()
  if rule == "max_words":
    return max(len(a.split()), len(b.split())) > cfg.max_words
  if rule == "max_length_ratio":
    wa, wb = len(a.split()), len(b.split())
    return max(wa, wb) > cfg.max_length_ratio * max(min(wa, wb), 1)
  if rule == "identical":
    return a.strip() == b.strip()
  if rule == "min_letter_fraction":
    return min(_letter_fraction(a), _letter_fraction(b)) < cfg.min_letter_fraction
  raise ValueError(rule)


def broken_rule(a: str, b: str, cfg: CleaningConfig, rules=CleaningConfig.RULES) -> str:
  """The first of `rules` (active ones only; not "duplicates") that the pair breaks, or ""."""
  for rule in rules:
    if rule != "duplicates" and getattr(cfg, rule) and _breaks(rule, a, b, cfg):
      return rule
  return ""


def pair_key(a: str, b: str) -> bytes:
  """What identifies a pair for the duplicate rule (a 16-byte hash of both sides)."""
  return hashlib.blake2b(f"{a}\t{b}".encode(), digest_size=16).digest()


class Cleaner:
  """Applies the rules to a stream of pairs (one process, file order), counting."""

  def __init__(self, cfg: CleaningConfig):
    self.cfg = cfg
    self.read = 0
    self.dropped = dict.fromkeys(cfg.active, 0)
    self.examples: dict[str, list] = {rule: [] for rule in cfg.active}
    self._seen: set[bytes] = set()

  def keep(self, line: int, a: str, b: str) -> bool:
    self.read += 1
    rule = broken_rule(a, b, self.cfg, BEFORE_DUPLICATES)
    if not rule and self.cfg.duplicates:
      key = pair_key(a, b)
      rule = "duplicates" if key in self._seen else ""
      self._seen.add(key)
    rule = rule or broken_rule(a, b, self.cfg, AFTER_DUPLICATES)
    if not rule:
      return True
    self.dropped[rule] += 1
    if len(self.examples[rule]) < self.cfg.examples:
      self.examples[rule].append([line, a, b])
    return False

  def report(self, split: str, langs: tuple[str, str], source: str) -> dict:
    return report(self.cfg, split, langs, source, self.read, self.dropped, self.examples)


def report(cfg: CleaningConfig, split: str, langs, source: str, read: int, dropped: dict,
           examples: dict) -> dict:
  return {"split": split, "languages": list(langs), "source": source, "rules": cfg.active,
          "pairs_read": read, "pairs_kept": read - sum(dropped.values()),
          "dropped": dict(dropped), "examples": {k: list(v) for k, v in examples.items()}}


def write_report(folder: Path, reports: list[dict]):
  atomic.write_json(Path(folder) / REPORT, reports, indent=1, ensure_ascii=False)


def log_report(rep: dict):
  """The counts and examples of every rule, in the log."""
  log.info("cleaning %s of %s: %d pairs read, %d kept", rep["split"], rep["source"],
           rep["pairs_read"], rep["pairs_kept"])
  for rule, count in rep["dropped"].items():
    log.info("  %-20s %8d dropped (%s)", rule, count, rep["rules"][rule])
    for line, a, b in rep["examples"][rule]:
      log.info("    line %d: %r ||| %r", line, a[:120], b[:120])


def read_reports(folder: Path) -> list[dict]:
  path = Path(folder) / REPORT
  return json.loads(path.read_text()) if path.is_file() else []
