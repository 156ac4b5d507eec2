"""The Apache Beam graph that prepares one split (`apache_beam_prep.beam_writer`): no pair
travels through Beam.

Beam carries only task descriptors and per-shard counts; pairs and their keys go through files
in the output folder (which every worker reads and writes), so a worker holds one input shard,
one hash partition or one output shard, and the runner (DirectRunner's driver included, which
keeps every shuffled element in memory) holds no per-pair data:
1. scan (a task per input shard): the duplicate-rule keys (`cleaning.pair_key`) of the pairs
   that pass the rules before "duplicates", with their line numbers, into one file per hash
   partition (only with the duplicate rule on);
2. dedup (a task per partition): each key's smallest line is its first occurrence; the other
   lines are duplicates, written to the partition's file of duplicate lines;
3. count (a task per input shard): every pair's verdict (the first rule it breaks, as
   `cleaning.Cleaner` decides in one process), the counts and first examples of each rule and
   the pairs kept;
4. parts (a task per input shard): its kept pairs, ranked in file order (the kept counts of the
   shards before it), into part files of the output shards they fall in;
5. concatenate (a task per output shard): its parts, in input order, into the shard.
The output shards therefore hold exactly the pairs, in the order and shard boundaries, that
`corpus.prepare_local` writes in one process.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gzip
import itertools
import json
import math
import os
from pathlib import Path

import numpy as np
import tensorflow_datasets as tfds
from array_record.python import array_record_module

from transformer_jax.config.corpora import CleaningConfig
from transformer_jax.data import cleaning as cleaning_lib
from transformer_jax.data import corpus
from transformer_jax.data.text import iter_lines
from transformer_jax.errors import DataError

LINES_PER_SHARD = 100_000  # input lines a worker reads at a time
PARTITIONS = 64  # hash partitions of the duplicate keys (a dedup task holds one)
KEY = np.dtype([("hi", "<u8"), ("lo", "<u8"), ("line", "<i8")])


@dataclasses.dataclass(frozen=True)
class LineShard:
  """Lines first_line .. first_line + count - 1 (1-based) of both files, read from `paths` (the
  files, or plain copies of gzipped ones) at these offsets; `names`: the files, for errors."""
  index: int
  first_line: int
  count: int
  paths: tuple[str, str]
  offsets: tuple[int, int]
  names: tuple[str, str] = ("", "")


def line_shards(path_a: Path, path_b: Path, lines_per_shard: int,
                unpack_dir: Path | None = None) -> list[LineShard]:
  """The input shards of two line-aligned files (one sequential pass over each). A gzipped file
  is unpacked in that pass into `unpack_dir` (a folder every worker reads), as
  `.beam-input-<its name without .gz>`, and the shards read the copy."""
  names, paths, starts = (str(path_a), str(path_b)), [], []
  for name in names:
    gz = name.endswith(".gz")
    if gz and unpack_dir is None:
      raise ValueError(f"{name} is gzipped: line_shards needs an unpack_dir")
    paths.append(str(Path(unpack_dir) / f".beam-input-{Path(name).name[:-3]}") if gz else name)
    offsets, position, lines = [], 0, 0
    with (gzip.open if gz else open)(name, "rb") as f, \
        (open(paths[-1], "wb") if gz else contextlib.nullcontext()) as copy:
      for raw in f:
        if lines % lines_per_shard == 0:
          offsets.append(position)
        position += len(raw)
        lines += 1
        if copy is not None:
          copy.write(raw)
    starts.append((offsets, lines))
  (offsets_a, lines_a), (offsets_b, lines_b) = starts
  if lines_a != lines_b:
    raise DataError(f"parallel files have different line counts: {path_a} has {lines_a} lines, "
                    f"{path_b} has {lines_b}")
  return [LineShard(i, 1 + i * lines_per_shard, min(lines_per_shard, lines_a - i * lines_per_shard),
                    tuple(paths), (offsets_a[i], offsets_b[i]), names)
          for i in range(len(offsets_a))]


def read_shard(shard: LineShard):
  """(line number, text a, text b) of the shard's lines, as `corpus.read_parallel` reads them."""
  with contextlib.ExitStack() as stack:
    sides = []
    for path, name, offset in zip(shard.paths, shard.names, shard.offsets):
      f = stack.enter_context(open(path, "rb"))
      f.seek(offset)
      sides.append(itertools.islice(iter_lines(f, name or path, shard.first_line),
                                    shard.count))
    for line, (a, b) in enumerate(zip(*sides), start=shard.first_line):
      yield line, a, b


def _keys_file(tmp: str, split: str, partition: int, shard: int) -> Path:
  return Path(tmp) / f".beam-keys-{split}-{partition:03d}-{shard:06d}.npy"


def _dups_file(tmp: str, split: str, partition: int) -> Path:
  return Path(tmp) / f".beam-dups-{split}-{partition:03d}.npy"


def _part_file(tmp: str, split: str, out_shard: int, shard: int) -> Path:
  return Path(tmp) / f".beam-part-{split}-{out_shard:06d}-{shard:06d}"


def _scan(shard, tmp: str, split: str, cfg: CleaningConfig) -> int:
  """Step 1: the keys of the shard's pairs that reach the duplicate rule, by partition."""
  keys = []
  for line, a, b in read_shard(shard):
    if not cleaning_lib.broken_rule(a, b, cfg, cleaning_lib.BEFORE_DUPLICATES):
      hi, lo = np.frombuffer(cleaning_lib.pair_key(a, b), "<u8")
      keys.append((hi, lo, line))
  keys = np.array(keys, KEY)
  for partition in range(PARTITIONS):
    np.save(_keys_file(tmp, split, partition, shard.index),
            keys[keys["hi"] % PARTITIONS == partition])
  return shard.index


def _dedup(partition: int, tmp: str, split: str, _scanned) -> int:
  """Step 2: the partition's duplicate lines (all but each key's smallest line), sorted.
  (`_scanned`, the scans' results, is a side input only so that this runs after them.)"""
  files = sorted(Path(tmp).glob(f".beam-keys-{split}-{partition:03d}-*.npy"))
  keys = np.concatenate([np.load(f) for f in files]) if files else np.zeros(0, KEY)
  keys = keys[np.lexsort((keys["line"], keys["lo"], keys["hi"]))]
  repeat = np.zeros(len(keys), bool)
  repeat[1:] = (keys["hi"][1:] == keys["hi"][:-1]) & (keys["lo"][1:] == keys["lo"][:-1])
  np.save(_dups_file(tmp, split, partition), np.sort(keys["line"][repeat]))
  for f in files:
    f.unlink()
  return partition


def _duplicate_lines(shard, tmp: str, split: str, cfg: CleaningConfig | None) -> set[int]:
  if cfg is None or not cfg.duplicates:
    return set()
  lines = set()
  for partition in range(PARTITIONS):
    dups = np.load(_dups_file(tmp, split, partition))
    lo, hi = np.searchsorted(dups, [shard.first_line, shard.first_line + shard.count])
    lines.update(dups[lo:hi].tolist())
  return lines


def _verdicts(shard, tmp: str, split: str, cfg: CleaningConfig | None):
  """(line, a, b, the first rule the pair breaks or "") of the shard's pairs."""
  dups = _duplicate_lines(shard, tmp, split, cfg)
  for line, a, b in read_shard(shard):
    rule = ""
    if cfg is not None:
      rule = (cleaning_lib.broken_rule(a, b, cfg, cleaning_lib.BEFORE_DUPLICATES)
              or ("duplicates" if line in dups else "")
              or cleaning_lib.broken_rule(a, b, cfg, cleaning_lib.AFTER_DUPLICATES))
    yield line, a, b, rule


def _count(shard, tmp: str, split: str, cfg: CleaningConfig | None, _deduped):
  """Step 3: (shard, pairs kept, dropped per rule, the first examples of each rule).
  (`_deduped`: a side input only so that this runs after the dedup step.)"""
  kept, dropped, examples = 0, collections.Counter(), collections.defaultdict(list)
  for line, a, b, rule in _verdicts(shard, tmp, split, cfg):
    if not rule:
      kept += 1
      continue
    dropped[rule] += 1
    if len(examples[rule]) < max(cfg.examples, 1):
      examples[rule].append([line, a, b])
  return shard.index, kept, dict(dropped), dict(examples)


def _parts(shard, tmp: str, split: str, langs, cfg: CleaningConfig | None, counts,
           per_shard: int):
  """Step 4: the shard's kept pairs into part files of their output shards; yields
  (output shard, (input shard, pairs in the part))."""
  kept = {index: n for index, n, _, _ in counts}
  rank = sum(n for index, n in kept.items() if index < shard.index)
  features = tfds.features.FeaturesDict({lang: tfds.features.Text() for lang in langs})
  serializer = corpus.pair_serializer(features)
  writer, out_shard, written = None, -1, 0
  for _, a, b, rule in _verdicts(shard, tmp, split, cfg):
    if rule:
      continue
    if rank // per_shard != out_shard:
      if writer is not None:
        writer.close()
        yield out_shard, (shard.index, written)
      out_shard, written = rank // per_shard, 0
      writer = array_record_module.ArrayRecordWriter(
          os.fspath(_part_file(tmp, split, out_shard, shard.index)), "group_size:1")
    writer.write(corpus.serialize_pair(serializer, features, langs, a, b))
    rank, written = rank + 1, written + 1
  if writer is not None:
    writer.close()
    yield out_shard, (shard.index, written)


def _concatenate(item, tmp: str, split: str, counts, per_shard: int):
  """Step 5: output shard `index` from its parts; returns (index, pairs, bytes)."""
  index, parts = item
  total = sum(n for _, n, _, _ in counts)
  path = corpus.shard_path(Path(tmp), split, index, math.ceil(total / per_shard))
  writer = array_record_module.ArrayRecordWriter(os.fspath(path), "group_size:1")
  pairs = 0
  for shard, n in sorted(parts):
    part = _part_file(tmp, split, index, shard)
    reader = array_record_module.ArrayRecordReader(os.fspath(part))
    for start in range(0, n, 1000):  # (a range of a thousand records at a time)
      for record in reader.read(start, min(start + 1000, n)):
        writer.write(record)
    reader.close()
    part.unlink()
    pairs += n
  writer.close()
  return index, pairs, path.stat().st_size


def split_graph(p, tmp: Path, folder: Path, split: str, langs, cfg: CleaningConfig | None,
                lines_per_shard: int, pairs_per_shard: int):
  """Adds the steps preparing `split` to pipeline `p`; its summary (output shards written,
  pairs read, dropped counts and examples per rule) goes to tmp/.beam-<split>.json."""
  import apache_beam as beam
  shards = line_shards(corpus.corpus_file(folder, split, langs[0]),
                       corpus.corpus_file(folder, split, langs[1]), lines_per_shard, tmp)
  tasks = p | f"{split}/shards" >> beam.Create(shards) | f"{split}/spread" >> beam.Reshuffle()
  deduped = p | f"{split}/no_dedup" >> beam.Create([None])
  if cfg is not None and cfg.duplicates:
    scanned = tasks | f"{split}/scan" >> beam.Map(_scan, str(tmp), split, cfg)
    deduped = (p | f"{split}/partitions" >> beam.Create(range(PARTITIONS))
               | f"{split}/spread_partitions" >> beam.Reshuffle()
               | f"{split}/dedup" >> beam.Map(_dedup, str(tmp), split,
                                              beam.pvalue.AsList(scanned)))
  counts = tasks | f"{split}/count" >> beam.Map(_count, str(tmp), split, cfg,
                                                beam.pvalue.AsList(deduped))
  written = (tasks | f"{split}/parts" >> beam.FlatMap(
      _parts, str(tmp), split, langs, cfg, beam.pvalue.AsList(counts), pairs_per_shard)
             | f"{split}/by_output_shard" >> beam.GroupByKey()
             | f"{split}/concatenate" >> beam.Map(_concatenate, str(tmp), split,
                                                  beam.pvalue.AsList(counts), pairs_per_shard))
  (p | f"{split}/once" >> beam.Create([None])
   | f"{split}/summary" >> beam.Map(_write_summary, str(tmp / f".beam-{split}.json"),
                                    beam.pvalue.AsList(written), beam.pvalue.AsList(counts),
                                    sum(s.count for s in shards),
                                    cfg.examples if cfg is not None else 0))


def _write_summary(_, path: str, written, counts, read: int, examples: int):
  dropped, first = collections.Counter(), collections.defaultdict(list)
  for _, _, shard_dropped, shard_examples in counts:
    dropped.update(shard_dropped)
    for rule, lines in shard_examples.items():
      first[rule].extend(lines)
  Path(path).write_text(json.dumps({
      "written": sorted(written), "read": read, "dropped": dict(dropped),
      "examples": {rule: sorted(lines)[:max(examples, 1)] for rule, lines in first.items()}}))
