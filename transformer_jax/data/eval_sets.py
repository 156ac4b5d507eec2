"""Evaluation and decoding sets: whole splits (or given sentences) tokenized, in fixed-shape,
length-sorted padded batches."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator

import numpy as np

from transformer_jax.config.sections import DataConfig
from transformer_jax.data import corpus
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import DataError

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EvalSet:
  """A split ready to decode: raw text, token ids, and fixed-shape padded batches."""
  sources: list[str]
  references: list[str]
  source_ids: list[np.ndarray]
  target_ids: list[np.ndarray]

  def __len__(self):
    return len(self.sources)

  @classmethod
  def from_pairs(cls, sources: list[str], references: list[str], tokenizer: Tokenizer
                 ) -> "EvalSet":
    """Tokenized sources (and references; [] when translating without them)."""
    references = references or [""] * len(sources)
    return cls(list(sources), list(references),
               [np.asarray(tokenizer.encode(s), np.int32) for s in sources],
               [np.asarray(tokenizer.encode(r), np.int32) for r in references])

  def batches(self, batch_size: int, max_len: int, bucket: int = 16
              ) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Length-sorted batches of exactly `batch_size` rows (padded with empty rows), source and
    target lengths padded to a multiple of `bucket` (few shapes, few compilations), truncated
    to `max_len`. Yields (indices of the real rows, batch)."""
    order = sorted(range(len(self)), key=lambda i: len(self.source_ids[i]))
    for start in range(0, len(order), batch_size):
      idx = np.asarray(order[start:start + batch_size])
      yield idx, {"inputs": _pad([self.source_ids[i] for i in idx], batch_size, max_len, bucket),
                  "targets": _pad([self.target_ids[i] for i in idx], batch_size, max_len,
                                  bucket)}


def _pad(seqs: list[np.ndarray], rows: int, max_len: int, bucket: int) -> np.ndarray:
  longest = max(len(s) for s in seqs)
  length = min(max_len, bucket * math.ceil(longest / bucket))
  out = np.zeros((rows, length), np.int32)
  for i, s in enumerate(seqs):
    s = s[:length]
    out[i, :len(s)] = s
  return out


def load_eval_set(cfg: DataConfig, split: str, tokenizer: Tokenizer,
                  max_sentences: int = 0, dataset: str = "") -> EvalSet:
  """Reads a whole split (eval/test sets are small) in file order, tokenized."""
  sources, references = [], []
  for src, ref in corpus.iterate_pairs(corpus.corpus_spec(cfg, dataset), split):
    sources.append(src)
    references.append(ref)
    if max_sentences and len(sources) >= max_sentences:
      break
  if not sources:
    raise DataError(f"split {split!r} of {dataset or cfg.dataset} is empty")
  log.info("Loaded %d %s pairs from split %r", len(sources), dataset or cfg.dataset, split)
  return EvalSet.from_pairs(sources, references, tokenizer)

