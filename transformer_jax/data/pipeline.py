"""The training input pipeline: shuffled, tokenized, length-filtered, packed batches per host,
with a checkpointable grain iterator.

Training reads the corpora of the run's data plan (`data.plan`: config.data's corpus alone, or a
mixture's) from the stores `data.tokenized` writes once: chunks of the shuffled stream are read
and filtered with numpy and packed by `data.packing`, optionally in grain worker processes
(`config.data.num_workers`). Runs whose config predates that store (`config.data.pretokenize`
False) tokenize each pair in grain threads at every epoch and pack with grain's
FirstFitPackIterDataset: the same pair stream (the same shuffle of the same shard, the same
filter), other batches.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator

import grain
import numpy as np
from absl import flags
from grain.experimental import FirstFitPackIterDataset

from transformer_jax.config.sections import DataConfig
from transformer_jax.data import corpus, mixture, packing, plan, tokenized
from transformer_jax.data.tokenizer import UNK_ID, Tokenizer
from transformer_jax.errors import ConfigError, DataError

# Pairs of the shuffled stream read (and filtered) together by the pre-tokenized path.
CHUNK_PAIRS = 1024


@dataclasses.dataclass
class FilterCounts:
  """Pairs taken from the stream: kept, and filtered out (empty side, or too long); in a
  mixture, the pairs drawn from each corpus and the tokens each gave."""
  cfg: DataConfig = dataclasses.field(repr=False)
  kept: int = 0
  empty: int = 0
  too_long: int = 0
  corpus_pairs: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))
  corpus_tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))

  @property
  def filtered(self) -> int:
    return self.empty + self.too_long

  def summary(self) -> str:
    return (f"{self.filtered} training pairs filtered out: {self.empty} with an empty side, "
            f"{self.too_long} longer than max_source_length={self.cfg.max_source_length} or "
            f"max_target_length={self.cfg.max_target_length} tokens")


class _TokenizeAndFilter(FilterCounts):
  """Tokenizes a raw pair and drops it (counting) when a side is empty or over the length
  limits; an epoch in which every pair is dropped is an error naming the counts."""

  def __init__(self, cfg: DataConfig, tokenizer: Tokenizer, epoch_size: int = 0):
    super().__init__(cfg)
    self.tokenizer, self.epoch_size = tokenizer, epoch_size
    self._lock = threading.Lock()

  def tokenize(self, example):
    src = self.tokenizer.encode(corpus.as_text(example[self.cfg.source_lang]))
    tgt = self.tokenizer.encode(corpus.as_text(example[self.cfg.target_lang]), "target")
    return {"inputs": np.asarray(src, np.int32), "targets": np.asarray(tgt, np.int32)}

  def keep(self, example) -> bool:
    # (the pre-tokenized path's rule, on one pair: both paths filter the same pairs)
    code = tokenized.filter_codes(np.array([len(example["inputs"])]),  # (EOS included)
                                  np.array([len(example["targets"])]), self.cfg)[0]
    with self._lock:
      if code == tokenized.EMPTY:
        self.empty += 1
      elif code == tokenized.TOO_LONG:
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
  """The training batches of this host and the counts of the pairs taken from the stream."""
  dataset: grain.IterDataset
  filter: FilterCounts
  num_examples: int  # pairs in this host's shard of the training split (one epoch)
  corpus_names: tuple[str, ...] = ()  # a mixture's corpora
  corpus_sizes: tuple[int, ...] = ()  # ... and the pairs in this host's shard of each

  def take_stats(self, batch: dict) -> dict:
    """`batch` without the pre-tokenized path's per-batch counts, which go into `filter`."""
    batch, stats = self.split_stats(batch)
    self.count(stats)
    return batch

  @staticmethod
  def split_stats(batch: dict) -> tuple[dict, dict | None]:
    """(the model's batch, its counts: STATS_KEYS and CORPUS_KEYS, or None on the text
    path)."""
    if packing.STATS_KEYS[0] not in batch:
      return batch, None  # (the text path counts as it filters)
    batch = dict(batch)
    return batch, {key: batch.pop(key) for key in packing.STATS_KEYS + packing.CORPUS_KEYS
                   if key in batch}

  def count(self, stats: dict | None):
    """Adds a batch's counts (from `split_stats`) when the batch is used."""
    if stats is not None:
      self.filter.kept += int(stats["pairs_kept"])
      self.filter.empty += int(stats["pairs_empty"])
      self.filter.too_long += int(stats["pairs_too_long"])
      if "corpus_pairs" in stats:
        self.filter.corpus_pairs = self.filter.corpus_pairs + stats["corpus_pairs"]
        self.filter.corpus_tokens = self.filter.corpus_tokens + stats["corpus_tokens"]

  @property
  def epochs(self) -> float | None:
    """Epochs of this host's shard taken so far (pre-tokenized path: exact), else None."""
    if isinstance(self.filter, _TokenizeAndFilter):
      return None  # (the text path's counts run ahead by what grain has read ahead)
    return (self.filter.kept + self.filter.filtered) / max(self.num_examples, 1)


def train_pipeline(data: plan.DataPlan, tokenizer: Tokenizer, seed: int,
                   process_index: int = 0, process_count: int = 1) -> TrainPipeline:
  """Shuffled (per epoch), tokenized, length-filtered, packed batches for this host.

  Each batch holds `batch_size // process_count` rows of `inputs`/`targets` with their
  `*_positions` and `*_segment_ids`; the iterator's state checkpoints through Orbax.
  Pass batches through `TrainPipeline.take_stats` to count the filtered pairs.
  """
  cfg = data.cfg
  if cfg.batch_size % process_count:
    raise ConfigError(f"config.data.batch_size={cfg.batch_size} is not divisible by the "
                      f"{process_count} processes")
  if not cfg.pretokenize:
    # (kept for exact resume: a run whose config.json predates data.pretokenize reads as
    # pretokenize=False, and its checkpointed iterator is this path's, with grain's packing)
    return _text(data.corpora[0], cfg, tokenizer, seed, process_index, process_count)
  return _pretokenized(data, tokenizer, seed, process_index, process_count)


def _order(num_pairs: int, seed: int, process_index: int, process_count: int
           ) -> grain.MapDataset:
  """The pair indices of this host's shard, shuffled anew every epoch, repeated."""
  return grain.MapDataset.range(num_pairs)[process_index::process_count].shuffle(
      seed=seed).repeat()


def _text(own: plan.TrainingCorpus, cfg: DataConfig, tokenizer: Tokenizer, seed: int,
          process_index: int, process_count: int) -> TrainPipeline:
  """Pairs tokenized in grain threads at every epoch, packed by grain."""
  source = corpus.get_source(own.train, own.split)
  if len(source) == 0:
    raise DataError(f"training split {own.split!r} of {own.where} is empty")
  shard = grain.MapDataset.source(source)[process_index::process_count]
  step = _TokenizeAndFilter(cfg, tokenizer, len(shard))
  ds = shard.shuffle(seed=seed).repeat().map(step.tokenize)  # (the order `_order` gives)
  ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=cfg.num_threads,
                                            prefetch_buffer_size=cfg.prefetch_buffer_size))
  ds = ds.filter(step.keep)
  rows = cfg.batch_size // process_count
  ds = FirstFitPackIterDataset(
      ds, length_struct={"inputs": cfg.max_source_length, "targets": cfg.max_target_length},
      num_packing_bins=rows, seed=seed, shuffle_bins=True)
  ds = ds.batch(rows, drop_remainder=True)
  return TrainPipeline(ds, step, step.epoch_size)


class _ReadChunk:
  """Reads and filters a chunk of pair indices from the tokenized store (picklable, for
  grain's worker processes)."""

  def __init__(self, store: tokenized.TokenizedSplit, cfg: DataConfig):
    self.store, self.cfg = store, cfg

  def __call__(self, indices: np.ndarray) -> dict[str, np.ndarray]:
    (src_start, src_end), (tgt_start, tgt_end) = (self.store.bounds(side, indices)
                                                  for side in tokenized.SIDES)
    codes = tokenized.filter_codes(src_end - src_start, tgt_end - tgt_start, self.cfg)
    kept = codes == tokenized.KEEP
    src = self.store.read_ids("source", src_start[kept], src_end[kept])
    tgt = self.store.read_ids("target", tgt_start[kept], tgt_end[kept])
    return packing.chunk(codes, (src, (src_end - src_start)[kept]),
                         (tgt, (tgt_end - tgt_start)[kept]))


class _SampleChunk(_ReadChunk):
  """Reads a chunk like `_ReadChunk`, each pair segmented anew by SentencePiece's sampling
  (`config.data.subword_sampling`) from the text its stored ids decode to; the chunk's
  generator (grain's, from the seed and the chunk's place in the stream) seeds the sampling,
  so a resumed run draws the same segmentations. A pair with an unknown piece keeps its stored
  ids (its text is not recoverable from them); lengths are filtered after sampling."""

  def __init__(self, store: tokenized.TokenizedSplit, cfg: DataConfig, tokenizer: Tokenizer):
    super().__init__(store, cfg)
    self.tokenizer, self.sampling = tokenizer, cfg.subword_sampling

  def __call__(self, indices: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    sides = []
    for side in tokenized.SIDES:
      start, end = self.store.bounds(side, indices)
      stored = np.split(self.store.read_ids(side, start, end), np.cumsum(end - start)[:-1])
      known = [i for i, ids in enumerate(stored) if not (ids == UNK_ID).any()]
      sampled = self.tokenizer.sample_batch(
          [self.tokenizer.detokenize(stored[i], side) for i in known], self.sampling.alpha,
          self.sampling.nbest_size, int(rng.integers(2**32)), side)
      for i, ids in zip(known, sampled):
        stored[i] = np.asarray(ids, np.int32)
      sides.append(stored)
    lengths = [np.asarray([len(ids) for ids in side], np.int64) for side in sides]
    codes = tokenized.filter_codes(*lengths, self.cfg)
    kept = np.flatnonzero(codes == tokenized.KEEP)
    return packing.chunk(codes, *((np.concatenate([side[i] for i in kept] or
                                                   [np.empty(0, np.int32)]), length[kept])
                                  for side, length in zip(sides, lengths)))


def _pretokenized(data: plan.DataPlan, tokenizer: Tokenizer, seed: int, process_index: int,
                  process_count: int) -> TrainPipeline:
  """The store of each corpus of the plan read in its order, filtered, packed; a mixture's
  pairs also counted per corpus."""
  cfg = data.cfg
  shard = slice(process_index, None, process_count)
  corpora = [_mixed_corpus(c, cfg, tokenizer, shard) for c in data.corpora]
  order, chunk = _order_of(data, corpora, seed, process_index, process_count)
  sampling = cfg.subword_sampling.active
  ds = _chunks(order, chunk, _reader(data, corpora, tokenizer), cfg, seed if sampling else None)
  counted = corpora if data.mixed else []  # (a corpus alone: its counts are the run's)
  counts = FilterCounts(cfg, corpus_pairs=np.zeros(len(counted), np.int64),
                        corpus_tokens=np.zeros(len(counted), np.int64))
  return TrainPipeline(_packed(ds, cfg, process_count, len(counted)), counts,
                       sum(sum(m.counts) for m in corpora), tuple(m.name for m in counted),
                       tuple(sum(m.counts) for m in counted))


def _mixed_corpus(planned: plan.TrainingCorpus, cfg: DataConfig, tokenizer: Tokenizer, shard: slice
            ) -> mixture.MixedCorpus:
  """A corpus tokenized (once, cached) and this host's shard of it counted; an error when it
  has no usable pair."""
  store = tokenized.tokenized_split(planned.train, tokenizer)
  if store.num_pairs == 0 and not planned.name:
    raise DataError(f"training split {planned.split!r} of {planned.where} is empty")
  prefix = tuple(planned.source_prefix(tokenizer))
  kept, empty, too_long = tokenized.count_codes(store, cfg, shard, source_extra=len(prefix)
                                                ).tolist()
  if kept == 0 and planned.name:
    raise DataError(f"config.data.corpora.{planned.name}: no usable training pair in split "
                    f"{planned.split!r} of {planned.where} ({empty} with an empty side, "
                    f"{too_long} too long)")
  if kept == 0:
    raise DataError(
        f"no usable training pair in split {planned.split!r} of {planned.where} "
        f"({empty + too_long} in this host's shard): "
        + FilterCounts(cfg, empty=empty, too_long=too_long).summary())
  return mixture.MixedCorpus(planned.name, store, prefix, planned.weight, (kept, empty, too_long))


def _order_of(data: plan.DataPlan, corpora: list[mixture.MixedCorpus], seed: int,
              process_index: int, process_count: int) -> tuple[grain.MapDataset, int]:
  """The stream's order and its chunk size: a mixture's interleaving, or config.data's corpus
  alone in its own order (which a mixture of one would not repeat: runs resume in the order
  they began). A chunk is no larger than the data: each pair drawn from a small corpus costs
  grain milliseconds, and a full chunk of one would take seconds to read."""
  if data.mixed:
    order = mixture.mixed_order([m.store.num_pairs for m in corpora],
                                [m.weight for m in corpora], seed, process_index, process_count)
    return order, min(CHUNK_PAIRS, sum(m.store.num_pairs for m in corpora))
  (own,) = corpora
  return (_order(own.store.num_pairs, seed, process_index, process_count),
          min(CHUNK_PAIRS, sum(own.counts)))


def _reader(data: plan.DataPlan, corpora: list[mixture.MixedCorpus], tokenizer: Tokenizer):
  """What reads a chunk of the order: a mixture's tagged (corpus, pair) indices, or a corpus
  alone's pair indices (segmented anew with subword sampling, which mixtures do not take)."""
  if data.mixed:
    return mixture.ReadMixedChunk(corpora, data.cfg)
  if data.cfg.subword_sampling.active:
    return _SampleChunk(corpora[0].store, data.cfg, tokenizer)
  return _ReadChunk(corpora[0].store, data.cfg)


def _chunks(order: grain.MapDataset, chunk: int, read, cfg: DataConfig,
            random_seed: int | None = None) -> grain.IterDataset:
  """Chunks of `chunk` indices of `order`, read (and filtered) by `read` in reader threads;
  with `random_seed`, `read` also takes a generator of its own for each chunk (grain's, from
  the seed and the chunk's index: the same chunk, the same draws, also after a resume)."""
  ahead = max(-(-cfg.prefetch_buffer_size // chunk), cfg.num_threads)  # (chunks; it counts pairs)
  chunks = order.batch(chunk)
  chunks = (chunks.map(read) if random_seed is None
            else chunks.random_map(read, seed=random_seed))
  return chunks.to_iter_dataset(
      grain.ReadOptions(num_threads=cfg.num_threads, prefetch_buffer_size=ahead))


def _packed(chunks: grain.IterDataset, cfg: DataConfig, process_count: int,
            num_corpora: int = 0) -> grain.IterDataset:
  """Batches packed from the chunk stream, in grain worker processes if asked for."""
  ds = packing.PackedBatches(chunks, cfg.batch_size // process_count,
                             (cfg.max_source_length, cfg.max_target_length), num_corpora)
  if cfg.num_workers:
    if not flags.FLAGS.is_parsed():  # (grain's workers read its absl flags: their defaults)
      flags.FLAGS(["transformer_jax"], known_only=True)
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.num_workers))
  return ds


def training_sentences(data: plan.DataPlan) -> Iterator[str]:
  """Both sides of every training pair of every corpus of the plan, streamed (for tokenizer
  training)."""
  for planned in data.corpora:
    for src, tgt in corpus.iterate_pairs(planned.train, planned.split):
      yield src
      yield tgt
