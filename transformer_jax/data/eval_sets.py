"""Evaluation and decoding sets: whole splits (or given sentences) tokenized, in fixed-shape,
length-sorted padded batches."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator

import numpy as np

from transformer_jax.config.sections import DataConfig
from transformer_jax.data import corpus, mixture
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


def load_eval_set(cfg: DataConfig, split: str, tokenizer: Tokenizer,
                  max_sentences: int = 0, dataset: str = "", spec: corpus.CorpusSpec | None = None,
                  source_prefix: list[int] | tuple[int, ...] = ()) -> EvalSet:
  """Reads a whole split (eval/test sets are small) in file order, tokenized; of `spec` when
  given (a mixture's corpus), each source after `source_prefix`."""
  sources, references = [], []
  read = spec or corpus.corpus_spec(cfg, dataset)
  if split not in read.splits:  # (a split the run's config does not name: prepared on its own)
    read = dataclasses.replace(read, splits=(split,))
  for src, ref in corpus.iterate_pairs(read, split):
    sources.append(src)
    references.append(ref)
    if max_sentences and len(sources) >= max_sentences:
      break
  where = spec.local_folder if spec else dataset or cfg.dataset
  if not sources:
    raise DataError(f"split {split!r} of {where} is empty")
  log.info("Loaded %d %s pairs from split %r", len(sources), where, split)
  return EvalSet.from_pairs(sources, references, tokenizer, source_prefix)


def direction_sets(cfg: DataConfig, tokenizer: Tokenizer, kind: str, max_sentences: int = 0
                   ) -> dict[str, EvalSet]:
  """The `kind` ("eval" or "test") split of each of a mixture's corpora that names one, by
  name `NAME.SPLIT` (one per direction of a multilingual model), its tag before each source."""
  return {f"{name}.{split}": _corpus_set(cfg, name, split, tokenizer, max_sentences)
          for name, split in ((name, entry.eval_split if kind == "eval" else entry.test_split)
                              for name, entry in cfg.corpora.items()) if split}


def direction_set(cfg: DataConfig, set_name: str, tokenizer: Tokenizer, max_sentences: int = 0
                  ) -> EvalSet | None:
  """The set `NAME.SPLIT` (a mixture corpus's eval or test split) if the config has one."""
  for name, entry in cfg.corpora.items():
    for split in filter(None, (entry.eval_split, entry.test_split)):
      if set_name == f"{name}.{split}":
        return _corpus_set(cfg, name, split, tokenizer, max_sentences)
  return None


def _corpus_set(cfg: DataConfig, name: str, split: str, tokenizer: Tokenizer,
                max_sentences: int) -> EvalSet:
  return load_eval_set(cfg, split, tokenizer, max_sentences,
                       spec=mixture.spec_of(cfg.corpora[name], cfg, (split,)),
                       source_prefix=mixture.source_prefix(cfg, name, tokenizer))


def scoring_sets(cfg: DataConfig, tokenizer: Tokenizer, max_sentences: int = 0
                 ) -> dict[str, EvalSet]:
  """The test sets: `test_split` (named by it) and each mixture corpus's (`NAME.SPLIT`)."""
  sets = {}
  if cfg.test_split:
    sets[cfg.test_split] = load_eval_set(cfg, cfg.test_split, tokenizer, max_sentences,
                                         dataset=cfg.test_dataset)
  sets.update(direction_sets(cfg, tokenizer, "test", max_sentences))
  return sets
