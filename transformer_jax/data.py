"""Input pipelines: a packed, shuffled, checkpointable grain pipeline for training, and padded
fixed-shape batches for evaluation and decoding."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Iterator

import grain
import numpy as np
import logging
from grain.experimental import FirstFitPackIterDataset

from transformer_jax import corpus
from transformer_jax.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where the corpus lives and how batches are made; built from `config.data`."""
  dataset: str = "local"          # "local" (folder of {split}.{lang}[.gz]) or a TFDS name
  data_dir: str = ""              # the local folder; "" = the embedded Multi30k corpus
  source_lang: str = "de"
  target_lang: str = "en"
  train_split: str = "train"
  eval_split: str = "val"         # validation loss and BLEU during training
  test_split: str = "test2016"    # BLEU at the end of training ("" to skip)
  eval_dataset: str = ""          # TFDS name for eval_split when it differs; "" = dataset
  test_dataset: str = ""          # TFDS name for test_split when it differs; "" = dataset
  cache_dir: str = ""             # prepared TFDS datasets; "" = ~/.cache/transformer_jax/tfds
  tokenizer_path: str = ""        # SentencePiece model; "" = <workdir>/spm.model
  tokenizer_max_sentences: int = 1_000_000  # sentences sampled to train the tokenizer
  tokenizer_max_chars: int = 0    # and at most this many characters of them (0 = no limit)
  max_source_length: int = 64     # longer training pairs are filtered out (and counted)
  max_target_length: int = 64     # packed row length on each side too
  batch_size: int = 64            # packed rows per global batch
  num_threads: int = 2            # grain reader threads
  prefetch_buffer_size: int = 64  # elements read ahead

  def __post_init__(self):
    if self.source_lang == self.target_lang:
      raise ValueError(f"config.data.source_lang and target_lang are both {self.source_lang!r}")
    for name in ("max_source_length", "max_target_length", "batch_size", "num_threads"):
      if getattr(self, name) < 1:
        raise ValueError(f"config.data.{name}={getattr(self, name)} must be >= 1")

  def corpus_spec(self, dataset: str = "") -> corpus.CorpusSpec:
    """The corpus of `dataset` (default: the training dataset) with the splits it serves."""
    dataset = dataset or self.dataset
    splits = [self.train_split] if dataset == self.dataset else []
    splits += [split for split, ds in ((self.eval_split, self.eval_dataset),
                                       (self.test_split, self.test_dataset))
               if split and (ds or self.dataset) == dataset]
    return corpus.CorpusSpec(dataset, self.data_dir, self.source_lang, self.target_lang,
                             tuple(dict.fromkeys(splits)),
                             self.cache_dir or corpus.DEFAULT_CACHE_DIR)


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
    src = self.tokenizer.encode(corpus._text(example[self.cfg.source_lang]))
    tgt = self.tokenizer.encode(corpus._text(example[self.cfg.target_lang]))
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
        raise corpus.DataError(
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
    raise ValueError(f"config.data.batch_size={cfg.batch_size} is not divisible by the "
                     f"{process_count} processes")
  source = corpus.get_source(cfg.corpus_spec(), cfg.train_split)
  if len(source) == 0:
    raise corpus.DataError(f"training split {cfg.train_split!r} of {cfg.dataset} is empty")
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
  for src, ref in corpus.iterate_pairs(cfg.corpus_spec(dataset), split):
    sources.append(src)
    references.append(ref)
    if max_sentences and len(sources) >= max_sentences:
      break
  if not sources:
    raise corpus.DataError(f"split {split!r} of {dataset or cfg.dataset} is empty")
  log.info("Loaded %d %s pairs from split %r", len(sources), dataset or cfg.dataset, split)
  return EvalSet.from_pairs(sources, references, tokenizer)


def training_sentences(cfg: DataConfig) -> Iterator[str]:
  """Both sides of every training pair, streamed (for tokenizer training)."""
  for src, tgt in corpus.iterate_pairs(cfg.corpus_spec(), cfg.train_split):
    yield src
    yield tgt
