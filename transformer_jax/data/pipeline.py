"""The training input pipeline: shuffled, tokenized, length-filtered, packed batches per host,
with a checkpointable grain iterator."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import grain
import numpy as np
from grain.experimental import FirstFitPackIterDataset

from transformer_jax.config.sections import DataConfig
from transformer_jax.data import corpus
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import ConfigError, DataError


class _TokenizeAndFilter:
  """Tokenizes a raw pair and drops it (counting) when a side is empty or over the length
  limits; an epoch in which every pair is dropped is an error naming the counts."""

  def __init__(self, cfg: DataConfig, tokenizer: Tokenizer, epoch_size: int = 0):
    self.cfg, self.tokenizer, self.epoch_size = cfg, tokenizer, epoch_size
    self.empty = self.too_long = self.kept = 0
    self._lock = threading.Lock()

  @property
  def filtered(self) -> int:
    return self.empty + self.too_long

  def summary(self) -> str:
    return (f"{self.filtered} training pairs filtered out: {self.empty} with an empty side, "
            f"{self.too_long} longer than max_source_length={self.cfg.max_source_length} or "
            f"max_target_length={self.cfg.max_target_length} tokens")

  def tokenize(self, example):
    src = self.tokenizer.encode(corpus.as_text(example[self.cfg.source_lang]))
    tgt = self.tokenizer.encode(corpus.as_text(example[self.cfg.target_lang]))
    return {"inputs": np.asarray(src, np.int32), "targets": np.asarray(tgt, np.int32)}

  def keep(self, example) -> bool:
    n_src, n_tgt = len(example["inputs"]), len(example["targets"])  # (EOS included)
    with self._lock:
      if n_src <= 1 or n_tgt <= 1:
        self.empty += 1
      elif n_src > self.cfg.max_source_length or n_tgt > self.cfg.max_target_length:
        self.too_long += 1
      else:
        self.kept += 1
        return True
      if not self.kept and self.filtered >= self.epoch_size > 0:
        raise DataError(
            f"no usable training pair in split {self.cfg.train_split!r} of "
            f"{self.cfg.dataset} ({self.epoch_size} in this host's shard): {self.summary()}")
      return False


@dataclasses.dataclass
class TrainPipeline:
  """The training batches of this host and the counter of filtered pairs."""
  dataset: grain.IterDataset
  filter: _TokenizeAndFilter
  num_examples: int  # pairs in this host's shard of the training split (one epoch)


def train_pipeline(cfg: DataConfig, tokenizer: Tokenizer, seed: int,
                   process_index: int = 0, process_count: int = 1) -> TrainPipeline:
  """Shuffled (per epoch), tokenized, length-filtered, packed batches for this host.

  Each batch holds `batch_size // process_count` rows of `inputs`/`targets` with their
  `*_positions` and `*_segment_ids`; the iterator's state checkpoints through Orbax.
  """
  if cfg.batch_size % process_count:
    raise ConfigError(f"config.data.batch_size={cfg.batch_size} is not divisible by the "
                      f"{process_count} processes")
  source = corpus.get_source(corpus.corpus_spec(cfg), cfg.train_split)
  if len(source) == 0:
    raise DataError(f"training split {cfg.train_split!r} of {cfg.dataset} is empty")
  shard = grain.MapDataset.source(source)[process_index::process_count]
  step = _TokenizeAndFilter(cfg, tokenizer, len(shard))
  ds = shard.shuffle(seed=seed).repeat().map(step.tokenize)
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=cfg.num_threads,
                                            prefetch_buffer_size=cfg.prefetch_buffer_size))
  ds = ds.filter(step.keep)
  rows = cfg.batch_size // process_count
  ds = FirstFitPackIterDataset(
      ds, length_struct={"inputs": cfg.max_source_length, "targets": cfg.max_target_length},
      num_packing_bins=rows, seed=seed, shuffle_bins=True)
  ds = ds.batch(rows, drop_remainder=True)
  return TrainPipeline(ds, step, len(shard))


def training_sentences(cfg: DataConfig) -> Iterator[str]:
  """Both sides of every training pair, streamed (for tokenizer training)."""
  for src, tgt in corpus.iterate_pairs(corpus.corpus_spec(cfg), cfg.train_split):
    yield src
    yield tgt
