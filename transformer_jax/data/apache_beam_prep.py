"""Preparing a local corpus with Apache Beam: for corpora past one machine (OPUS-scale), the
same cleaning rules and the same prepared dataset, shard for shard, as `corpus.prepare_local`
makes in one process.

`beam_writer(runner, options)` is a `write_splits` for `corpus.prepare_local`: per split, the
graph of `data.apache_beam_graph` (input shards by line range, gzipped files unpacked by the
driver's indexing pass; the duplicate rule through hash-partition files; kept pairs ranked in file
order into the same output shards; no pair travels through Beam itself), then the same
cleaning report from the per-shard counts and first examples.
`beam_tokenizer(runner, options)` is a `write_ids` for `tokenized.tokenized_split`: workers
tokenize ranges of the prepared split into part files, the driver concatenates them in order
and adds the offsets, so the id store equals the one-process store byte for byte.
`cache_dir` must be a filesystem every worker writes to (local for DirectRunner, NFS for a
cluster runner).
"""

from __future__ import annotations

import json
from pathlib import Path

from transformer_jax.data import apache_beam_graph, corpus
from transformer_jax.data import cleaning as cleaning_lib
from transformer_jax.data.apache_beam_graph import LINES_PER_SHARD
from transformer_jax.data.tokenizer import SIDES, Tokenizer
from transformer_jax.errors import ConfigError, DataError


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
  tokenizer = Tokenizer.from_bytes(model_proto)
  for side, lang in zip(SIDES, langs):
    ids = tokenizer.encode_batch([corpus.as_text(ex[lang]) for ex in examples], side)
    lengths = np.fromiter(map(len, ids), np.int64, len(ids))
    (Path(out) / f"{side}.lengths.{index:06d}").write_bytes(lengths.tobytes())
    (Path(out) / f"{side}.ids.{index:06d}").write_bytes(
        np.fromiter((i for seq in ids for i in seq), id_dtype, int(lengths.sum())).tobytes())
  return index


def beam_tokenizer(runner: str = "DirectRunner", options: list[str] | tuple[str, ...] = (),
                   pairs_per_task: int = LINES_PER_SHARD):
  """A `write_ids` for `tokenized.tokenized_split` that tokenizes in a Beam pipeline."""
  beam, pipeline_options = _beam()

  def write_ids(tmp: Path, spec, split: str, tokenizer: Tokenizer, total: int, id_dtype: str):
    import numpy as np
    builder_dir = str(corpus.get_builder(spec).data_dir)
    tasks = [(i, start, min(start + pairs_per_task, total))
             for i, start in enumerate(range(0, total, pairs_per_task))]
    with beam.Pipeline(runner=runner, options=pipeline_options(list(options))) as p:
      _ = (p | "ranges" >> beam.Create(tasks) | "spread" >> beam.Reshuffle()
           | "tokenize" >> beam.Map(_tokenize_range, builder_dir, split,
                                    (spec.source_lang, spec.target_lang), tokenizer.model_proto,
                                    id_dtype, str(tmp)))
    ends = {}
    for side in SIDES:
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
        apache_beam_graph.split_graph(p, tmp, folder, split, langs,
                                      cfg if split == clean_split else None, lines_per_shard,
                                      corpus.PAIRS_PER_SHARD)
    for pattern in (".beam-input-*", ".beam-dups-*"):  # (gzipped inputs' plain copies, the
      for leftover in tmp.glob(pattern):              # duplicate lines of each partition)
        leftover.unlink()
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
