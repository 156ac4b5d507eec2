"""Evaluation and decoding sets: whole splits (or given sentences) tokenized, in fixed-shape,
length-sorted padded batches."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator

import numpy as np

from transformer_jax.config.sections import DataConfig
from transformer_jax.data import corpus, plan
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import DataError

log = logging.getLogger(__name__)


@dataclasses.dataclass
class EvalSet:
  """A split ready to decode: raw text, token ids, and fixed-shape padded batches; optionally
  a target prefix per sentence (ids without EOS) that decoding must start with, and the ids
  (a tag's) that every source starts with."""
  sources: list[str]
  references: list[str]
  source_ids: list[np.ndarray]
  target_ids: list[np.ndarray]
  prefix_ids: list[np.ndarray] | None = None
  source_prefix: tuple[int, ...] = ()

  def __len__(self):
    return len(self.sources)

  @classmethod
  def from_pairs(cls, sources: list[str], references: list[str], tokenizer: Tokenizer,
                 source_prefix: list[int] | tuple[int, ...] = ()) -> "EvalSet":
    """Tokenized sources, each after `source_prefix` (a tag's id), and references ([] when
    translating without them)."""
    references = references or [""] * len(sources)
    prefix = list(source_prefix)
    return cls(list(sources), list(references),
               [np.asarray(prefix + tokenizer.encode(s), np.int32) for s in sources],
               [np.asarray(tokenizer.encode(r, "target"), np.int32) for r in references],
               source_prefix=tuple(prefix))

  def with_prefixes(self, prefixes: list[str], tokenizer: Tokenizer) -> "EvalSet":
    """The same set with a target prefix per sentence (line-aligned; "" = none)."""
    if len(prefixes) != len(self):
      raise DataError(f"{len(prefixes)} target prefixes for {len(self)} sentences: one line "
                      "per input line, empty for none")
    return dataclasses.replace(self, prefix_ids=[
        np.asarray(tokenizer.encode(p, "target")[:-1] if p.strip() else [], np.int32)
        for p in prefixes])

  def batches(self, batch_size: int, max_len: int, bucket: int = 16
              ) -> Iterator[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Length-sorted batches of exactly `batch_size` rows (padded with empty rows), source and
    target lengths padded to a multiple of `bucket` (few shapes, few compilations), truncated
    to `max_len`. Yields (indices of the real rows, batch)."""
    order = sorted(range(len(self)), key=lambda i: len(self.source_ids[i]))
    for start in range(0, len(order), batch_size):
      idx = np.asarray(order[start:start + batch_size])
      batch = {"inputs": _pad([self.source_ids[i] for i in idx], batch_size, max_len, bucket),
               "targets": _pad([self.target_ids[i] for i in idx], batch_size, max_len, bucket)}
      if self.prefix_ids is not None:  # (0-padded; at least one column: 0 = nothing forced)
        batch["prefixes"] = _pad([self.prefix_ids[i] for i in idx], batch_size, max_len,
                                 bucket, min_length=1)
      yield idx, batch


def _pad(seqs: list[np.ndarray], rows: int, max_len: int, bucket: int, min_length: int = 0
         ) -> np.ndarray:
  longest = max(len(s) for s in seqs)
  length = max(min_length, min(max_len, bucket * math.ceil(longest / bucket)))
  out = np.zeros((rows, length), np.int32)
  for i, s in enumerate(seqs):
    s = s[:length]
    out[i, :len(s)] = s
  return out


def load_eval_set(cfg: DataConfig, split: str, tokenizer: Tokenizer, max_sentences: int = 0,
                  dataset: str = "") -> EvalSet:
  """A split of config.data's corpus (of `dataset`, default config.data.dataset), read whole
  (eval/test sets are small) in file order, tokenized."""
  return read_split(plan.own_split(split, cfg, split, dataset), tokenizer, max_sentences)


def read_split(planned: plan.EvalSplit, tokenizer: Tokenizer, max_sentences: int = 0) -> EvalSet:
  """A planned split read whole in file order, tokenized; a mixture corpus's with its tag's id
  before each source."""
  prefix = planned.corpus.source_prefix(tokenizer) if planned.corpus else []
  sources, references = [], []
  for src, ref in corpus.iterate_pairs(planned.spec, planned.split):
    sources.append(src)
    references.append(ref)
    if max_sentences and len(sources) >= max_sentences:
      break
  if not sources:
    raise DataError(f"split {planned.split!r} of {planned.where} is empty")
  log.info("Loaded %d %s pairs from split %r", len(sources), planned.where, planned.split)
  return EvalSet.from_pairs(sources, references, tokenizer, prefix)


def validation_sets(data: plan.DataPlan, tokenizer: Tokenizer, max_sentences: int = 0
                    ) -> dict[str, EvalSet]:
  """The validation sets by name: "" (config.data.eval_split), then each mixture corpus's
  `NAME.SPLIT` (one per direction of a multilingual model)."""
  return {s.name: read_split(s, tokenizer, max_sentences) for s in data.eval_splits}


def direction_set(data: plan.DataPlan, set_name: str, tokenizer: Tokenizer,
                  max_sentences: int = 0) -> EvalSet | None:
  """The set `NAME.SPLIT` (a mixture corpus's eval or test split) if the plan has one."""
  planned = data.corpus_split(set_name)
  return read_split(planned, tokenizer, max_sentences) if planned else None


def scoring_sets(data: plan.DataPlan, tokenizer: Tokenizer, max_sentences: int = 0
                 ) -> dict[str, EvalSet]:
  """The test sets: `test_split` (named by it) and each mixture corpus's (`NAME.SPLIT`)."""
  return {s.name: read_split(s, tokenizer, max_sentences) for s in data.test_splits}
