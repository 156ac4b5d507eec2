"""Preparing a local corpus with Apache Beam: for corpora past one machine (OPUS-scale), the
same cleaning rules and the same prepared dataset, shard for shard, as `corpus.prepare_local`
makes in one process.

`beam_writer(runner, options)` is a `write_splits` for `corpus.prepare_local`. Per split:
1. the driver indexes both files in one sequential pass: the byte offsets of every
   `lines_per_shard`-th line (a gzipped file cannot be sought in: the same pass unpacks it
   into a plain copy beside the output, which the workers read by offset and which is removed
   at the end; OPUS corpora come gzipped, and one shard would put the whole corpus on one
   worker);
2. workers read the input shards (both files from those offsets), apply the rules before
   "duplicates" (`cleaning.broken_rule`), group the survivors by `cleaning.pair_key` keeping
   each pair's first line (the rest count as duplicates), then apply the rules after it;
3. each survivor's rank in file order is its input shard's offset (a side input of the
   per-shard counts) plus its place in the shard, so the output shards hold exactly the
   pairs, in the order and the shard boundaries, that `prepare_local` writes;
4. counts and the first examples of each rule (smallest line numbers) come back to the driver
   for the same cleaning report.
`beam_tokenizer(runner, options)` is a `write_ids` for `tokenized.tokenized_split`: workers
tokenize ranges of the prepared split into part files, the driver concatenates them in order
and adds the offsets, so the id store equals the one-process store byte for byte.
`cache_dir` must be a filesystem every worker writes to (local for DirectRunner, NFS for a
cluster runner).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import itertools
import json
import math
import os
from pathlib import Path

from transformer_jax.config.corpora import CleaningConfig
from transformer_jax.data import cleaning as cleaning_lib
from transformer_jax.data import corpus
from transformer_jax.data.text import iter_lines
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import ConfigError, DataError

LINES_PER_SHARD = 100_000  # input lines a worker reads at a time


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


def _write_shard(item, out: str, split: str, langs, per_shard: int, total: int):
  """Writes output shard `index` of its (rank, a, b) pairs; returns (index, pairs, bytes)."""
  import tensorflow_datasets as tfds
  from array_record.python import array_record_module
  index, ranked = item
  features = tfds.features.FeaturesDict({lang: tfds.features.Text() for lang in langs})
  count = math.ceil(total / per_shard)
  path = corpus.shard_path(Path(out), split, index, count)
  writer = array_record_module.ArrayRecordWriter(os.fspath(path), "group_size:1")
  ranked, serializer = sorted(ranked), corpus.pair_serializer(features)
  for _, a, b in ranked:
    writer.write(corpus.serialize_pair(serializer, features, langs, a, b))
  writer.close()
  return index, len(ranked), path.stat().st_size


def _ranked(item, counts: dict, per_shard: int):
  """(output shard, (rank, a, b)) of an input shard's survivors."""
  index, pairs = item
  start = sum(counts.get(j, 0) for j in range(index))
  for k, (_, a, b) in enumerate(sorted(pairs)):
    yield (start + k) // per_shard, (start + k, a, b)


def _split_graph(p, tmp: Path, folder: Path, split: str, langs, cfg: CleaningConfig | None,
                 lines_per_shard: int, pairs_per_shard: int):
  import apache_beam as beam
  shards = line_shards(corpus.corpus_file(folder, split, langs[0]),
                       corpus.corpus_file(folder, split, langs[1]), lines_per_shard, tmp)
  pairs = (p | f"{split}/shards" >> beam.Create(shards) | f"{split}/spread" >> beam.Reshuffle()
           | f"{split}/read" >> beam.FlatMap(read_shard))
  dropped = []
  if cfg is not None:
    before, after = cleaning_lib.BEFORE_DUPLICATES, cleaning_lib.AFTER_DUPLICATES
    judged = pairs | f"{split}/rules" >> beam.Map(
        lambda t: (cleaning_lib.broken_rule(t[1], t[2], cfg, before), t))
    dropped.append(judged | f"{split}/broken" >> beam.Filter(lambda rt: rt[0]))
    pairs = judged | f"{split}/passed" >> beam.Filter(lambda rt: not rt[0]) | \
        f"{split}/untag" >> beam.Values()
    if cfg.duplicates:
      groups = (pairs | f"{split}/key" >> beam.Map(lambda t: (cleaning_lib.pair_key(t[1], t[2]), t))
                | f"{split}/same" >> beam.GroupByKey())
      dropped.append(groups | f"{split}/repeats" >> beam.FlatMap(
          lambda kv: [("duplicates", t) for t in sorted(kv[1])[1:]]))
      pairs = groups | f"{split}/first" >> beam.Map(lambda kv: min(kv[1]))
    judged = pairs | f"{split}/rules_after" >> beam.Map(
        lambda t: (cleaning_lib.broken_rule(t[1], t[2], cfg, after), t))
    dropped.append(judged | f"{split}/broken_after" >> beam.Filter(lambda rt: rt[0]))
    pairs = judged | f"{split}/kept" >> beam.Filter(lambda rt: not rt[0]) | \
        f"{split}/untag_after" >> beam.Values()
  per_shard = pairs | f"{split}/by_shard" >> beam.Map(
      lambda t: ((t[0] - 1) // lines_per_shard, t))
  counts = per_shard | f"{split}/count" >> beam.combiners.Count.PerKey()
  total = (counts | f"{split}/counts" >> beam.Values()
           | f"{split}/total" >> beam.CombineGlobally(sum))
  written = (per_shard | f"{split}/group" >> beam.GroupByKey()
             | f"{split}/rank" >> beam.FlatMap(_ranked, beam.pvalue.AsDict(counts),
                                               pairs_per_shard)
             | f"{split}/out_shards" >> beam.GroupByKey()
             | f"{split}/write" >> beam.Map(_write_shard, str(tmp), split, langs,
                                            pairs_per_shard, beam.pvalue.AsSingleton(total)))
  summary = {"written": beam.pvalue.AsList(written),
             "read": beam.pvalue.AsSingleton(p | f"{split}/n" >> beam.Create(
                 [sum(s.count for s in shards)]))}
  if dropped:
    drops = dropped | f"{split}/drops" >> beam.Flatten()
    summary["dropped"] = beam.pvalue.AsDict(
        drops | f"{split}/ones" >> beam.Map(lambda rt: (rt[0], 1))
        | f"{split}/per_rule" >> beam.CombinePerKey(sum))
    summary["examples"] = beam.pvalue.AsDict(
        drops | f"{split}/smallest" >> beam.combiners.Top.SmallestPerKey(max(cfg.examples, 1)))
  (p | f"{split}/once" >> beam.Create([None])
   | f"{split}/summary" >> beam.Map(_write_summary, str(tmp / f".beam-{split}.json"), **summary))


def _write_summary(_, path: str, written, read, dropped=None, examples=None):
  Path(path).write_text(json.dumps({
      "written": sorted(written), "read": read, "dropped": dropped or {},
      "examples": {k: [list(t) for t in v] for k, v in (examples or {}).items()}}))


def _beam():
  try:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
  except ImportError:
    raise ConfigError("preparing with Beam needs apache-beam: pip install "
                      "'transformer_jax[beam]'") from None
  return beam, PipelineOptions


def _tokenize_range(item, builder_dir: str, split: str, langs, model_proto: bytes,
                    id_dtype: str, out: str):
  """Tokenizes pairs start..end of the prepared split into part files `index`."""
  import numpy as np
  import tensorflow_datasets as tfds
  index, start, end = item
  source = tfds.builder_from_directory(builder_dir).as_data_source(split=split)
  examples = source.__getitems__(range(start, end))
  tok = Tokenizer(model_proto)
  for side, lang in zip(("source", "target"), langs):
    ids = tok.encode_batch([corpus.as_text(ex[lang]) for ex in examples])
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    (Path(out) / f"{side}.lengths.{index:06d}").write_bytes(lengths.tobytes())
    (Path(out) / f"{side}.ids.{index:06d}").write_bytes(
        np.fromiter((i for seq in ids for i in seq), id_dtype, int(lengths.sum())).tobytes())
  return index


def beam_tokenizer(runner: str = "DirectRunner", options: list[str] | tuple[str, ...] = (),
                   pairs_per_task: int = LINES_PER_SHARD):
  """A `write_ids` for `tokenized.tokenized_split` that tokenizes in a Beam pipeline."""
  beam, pipeline_options = _beam()

  def write_ids(tmp: Path, spec, split: str, tok: Tokenizer, total: int, id_dtype: str):
    import numpy as np
    builder_dir = str(corpus.get_builder(spec).data_dir)
    tasks = [(i, start, min(start + pairs_per_task, total))
             for i, start in enumerate(range(0, total, pairs_per_task))]
    with beam.Pipeline(runner=runner, options=pipeline_options(list(options))) as p:
      _ = (p | "ranges" >> beam.Create(tasks) | "spread" >> beam.Reshuffle()
           | "tokenize" >> beam.Map(_tokenize_range, builder_dir, split,
                                    (spec.source_lang, spec.target_lang), tok.model_proto,
                                    id_dtype, str(tmp)))
    ends = {}
    for side in ("source", "target"):
      position = 0
      with open(tmp / f"{side}.ids", "wb") as ids, open(tmp / f"{side}.offsets", "wb") as offs:
        offs.write(np.zeros(1, np.int64).tobytes())
        for i, _, _ in tasks:
          lengths_part, ids_part = (tmp / f"{side}.lengths.{i:06d}", tmp / f"{side}.ids.{i:06d}")
          lengths = np.frombuffer(lengths_part.read_bytes(), np.int64)
          offs.write((position + np.cumsum(lengths)).tobytes())
          position += int(lengths.sum())
          ids.write(ids_part.read_bytes())
          lengths_part.unlink()
          ids_part.unlink()
      ends[side] = position
    return total, ends

  return write_ids


def beam_writer(runner: str = "DirectRunner", options: list[str] | tuple[str, ...] = (),
                lines_per_shard: int = LINES_PER_SHARD):
  """A `write_splits` for `corpus.prepare_local` that runs one Beam pipeline for all splits
  (output shards of `corpus.PAIRS_PER_SHARD` pairs, as the driver has it)."""
  beam, PipelineOptions = _beam()  # noqa: N806 (a class)

  def write_splits(tmp: Path, folder: Path, splits, langs, features, cfg, clean_split):
    import tensorflow_datasets as tfds
    with beam.Pipeline(runner=runner, options=PipelineOptions(list(options))) as p:
      for split in splits:
        _split_graph(p, tmp, folder, split, langs, cfg if split == clean_split else None,
                     lines_per_shard, corpus.PAIRS_PER_SHARD)
    for unpacked in tmp.glob(".beam-input-*"):  # (gzipped inputs' plain copies)
      unpacked.unlink()
    infos, reports = [], []
    for split in splits:
      summary = json.loads((tmp / f".beam-{split}.json").read_text())
      (tmp / f".beam-{split}.json").unlink()
      if not summary["written"]:
        raise DataError(f"no pair of split {split!r} is left after cleaning")
      infos.append(tfds.core.SplitInfo(name=split,
                                       shard_lengths=[n for _, n, _ in summary["written"]],
                                       num_bytes=sum(b for _, _, b in summary["written"])))
      if cfg is not None and split == clean_split:
        dropped = {rule: summary["dropped"].get(rule, 0) for rule in cfg.active}
        examples = {rule: summary["examples"].get(rule, [])[:cfg.examples]
                    for rule in cfg.active}
        reports.append(cleaning_lib.report(cfg, split, langs, str(folder.resolve()),
                                           summary["read"], dropped, examples))
    return infos, reports

  return write_splits
