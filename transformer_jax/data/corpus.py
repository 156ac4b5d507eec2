"""Parallel text corpora as TFDS datasets: local folders of text files and TFDS names.

A local corpus is a folder of line-aligned files named `{split}.{lang}` or `{split}.{lang}.gz`
(UTF-8, one sentence per line). `prepare_local` streams it into a TFDS dataset stored as
`array_record` (bounded memory, prepared once, cached by the files' fingerprint), read by
random access through `as_data_source` — no TensorFlow needed. Named TFDS datasets (e.g.
`wmt17_translate/de-en`) go through the same `get_source` call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import itertools
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from array_record.python import array_record_module

from transformer_jax import atomic
from transformer_jax.config.corpora import CleaningConfig
from transformer_jax.config.folders import cache_home
from transformer_jax.config.sections import DataConfig
from transformer_jax.data import cleaning as cleaning_lib
from transformer_jax.data.text import read_lines
from transformer_jax.errors import ConfigError, DataError

log = logging.getLogger(__name__)

# The embedded default corpus (Multi30k Task 1, de/en, train/val/test2016).
EMBEDDED_MULTI30K = Path(__file__).parents[1] / "corpora" / "multi30k"


def _tfds():  # (imported when first used; BENCHMARKS.md, "A decoding tool's first seconds")
  import tensorflow_datasets  # noqa: PLC0415 (a deliberate deferral of a heavy library)
  return tensorflow_datasets


def default_cache_dir() -> str:
  """Prepared datasets when config.data.cache_dir is "": the package's cache folder's tfds/."""
  return str(cache_home() / "tfds")


def corpus_file(folder: str | Path, split: str, lang: str) -> Path:
  """The file holding `split` in `lang`, plain or gzipped; a clear error when absent."""
  folder = Path(folder)
  for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
    if (folder / name).is_file():
      return folder / name
  if folder.is_file():
    raise DataError(f"data folder {folder} is a file, not a folder of {{split}}.{{lang}} files; "
                    "for one file of tab-separated pairs, make the folder with "
                    "transformer-jax-split-corpus")
  if not folder.is_dir():
    raise DataError(f"data folder {folder} does not exist")
  present = sorted(p.name for p in folder.iterdir())
  raise DataError(
      f"missing data file {folder}/{split}.{lang}[.gz] (split {split!r}, language {lang!r}); "
      f"the folder holds: {', '.join(present) or 'nothing'}")


def read_aligned(path_a: Path, path_b: Path) -> Iterator[tuple[int, str, str]]:
  """Streams (line_number, line_a, line_b) of two line-aligned files; an error naming both files
  and their line counts when these differ."""
  count = lines_a = lines_b = 0
  for a, b in itertools.zip_longest(read_lines(path_a), read_lines(path_b)):
    lines_a += a is not None
    lines_b += b is not None
    if a is not None and b is not None:
      count += 1
      yield count, a, b
  if lines_a != lines_b:  # found only at the end: the files are streamed, never held in memory
    raise DataError(f"parallel files have different line counts: {path_a} has {lines_a} lines, "
                    f"{path_b} has {lines_b}")


def read_parallel(folder: str | Path, split: str, langs: tuple[str, str]
                  ) -> Iterator[tuple[int, str, str]]:
  """Streams (line_number, text_a, text_b) of a split; errors on unequal line counts."""
  path_a, path_b = (corpus_file(folder, split, lang) for lang in langs)
  count = tabs = same = 0
  for count, a, b in read_aligned(path_a, path_b):
    if count <= _LAYOUT_CHECK_LINES:
      tabs += "\t" in a and "\t" in b
      same += a == b
      if count == _LAYOUT_CHECK_LINES:
        _check_layout(count, tabs, same, path_a, path_b)
    yield count, a, b
  if count == 0:
    raise DataError(f"split {split!r} is empty: {path_a} and {path_b} have no lines")


_LAYOUT_CHECK_LINES = 100  # the first lines of each split looked at for a wrong layout


def _check_layout(lines: int, tabs: int, same: int, path_a: Path, path_b: Path):
  """Errors on the layouts that train on the wrong text: every one of a split's first lines
  holding a tab on both sides (tab-separated pairs under {split}.{lang} names), or the two
  sides identical (one file given for both languages)."""
  if tabs == lines:
    raise DataError(f"{path_a} and {path_b}: each of their first {lines} lines holds a tab: "
                    "tab-separated pairs? make a folder of one sentence per line with "
                    "transformer-jax-split-corpus")
  if same == lines:
    raise DataError(f"{path_a} and {path_b}: their first {lines} lines are identical: the "
                    "same text on both sides (one file for both languages?)")


def _fingerprint(folder: Path, splits: tuple[str, ...], langs: tuple[str, str]) -> str:
  """A short hash of the corpus files' names, sizes and mtimes: new files, new prepared copy."""
  h = hashlib.sha1()
  for split in splits:
    for lang in langs:
      p = corpus_file(folder, split, lang)
      st = p.stat()
      h.update(f"{p.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode())
  return h.hexdigest()[:10]


# Pairs per array_record shard of a prepared local corpus. Small on purpose: array_record
# 0.8's read of a list of positions (what the data sources call) costs time in proportion to
# the records in the file (BENCHMARKS.md, "Data path: Tatoeba de–en").
PAIRS_PER_SHARD = 10_000
_NAME = "parallel_text"      # TFDS dataset name of prepared local corpora


def prepare_local(folder: str | Path, splits: tuple[str, ...], langs: tuple[str, str],
                  cache_dir: str, cleaning: CleaningConfig | None = None,
                  clean_split: str = "", write_splits=None) -> Path:
  """Prepares (once) a local corpus as a TFDS array_record dataset; returns its folder.

  Streams each split's files into shards of PAIRS_PER_SHARD pairs in file order, then writes
  TFDS metadata (`tfds.folder_dataset.write_metadata`), so `tfds.builder_from_directory` reads
  it. Memory stays bounded whatever the corpus size: TFDS's own GeneratorBasedBuilder writer
  holds up to 1 GB of examples (all of them when order is kept), so it is not used here. The
  dataset appears under its final name only when complete: an interrupted preparation is redone.
  With `cleaning` rules active, `clean_split` goes through them (`data.cleaning`), and their
  report is written beside the shards (`cleaning.json`) and logged. `write_splits` writes
  the shards (default `write_splits`, in this process; `data.apache_beam_prep.beam_writer`: a Beam
  pipeline making the same files).
  """
  folder, langs = Path(folder), tuple(sorted(langs))
  active = cleaning.active if cleaning is not None and clean_split in splits else {}
  name = f"{'-'.join(langs)}_{_fingerprint(folder, tuple(splits), langs)}" + _clean_key(active)
  out = Path(cache_dir) / _NAME / name / "1.0.0"
  if (out / "dataset_info.json").is_file():
    damage = _damage(out)
    if not damage:
      for rep in cleaning_lib.read_reports(out):
        log.info("cleaned %s of %s: %d of %d pairs kept (%s; %s)", rep["split"], folder,
                 rep["pairs_kept"], rep["pairs_read"], ", ".join(
                     f"{k} -{v}" for k, v in rep["dropped"].items()), out / cleaning_lib.REPORT)
      return out
    log.warning("prepared corpus %s is damaged (%s): preparing it again from %s", out, damage,
                folder)
  out.parent.mkdir(parents=True, exist_ok=True)
  for stale in out.parent.glob(".incomplete-*"):  # (callers hold the preparation lock)
    shutil.rmtree(stale)
  tmp = out.with_name(f".incomplete-{os.getpid()}")
  tmp.mkdir()
  features = _tfds().features.FeaturesDict({lang: _tfds().features.Text() for lang in langs})
  try:
    split_infos, reports = (write_splits or _write_splits)(
        tmp, folder, tuple(dict.fromkeys(splits)), langs, features,
        cleaning if active else None, clean_split)
    for rep in reports:
      cleaning_lib.log_report(rep)
    if reports:
      cleaning_lib.write_report(tmp, reports)
    _tfds().folder_dataset.write_metadata(
        data_dir=tmp, features=features, split_infos=split_infos, check_data=False,
        description=f"Parallel text from {folder.resolve()}", disable_shuffling=True)
  except BaseException:  # (a bad file, an interrupt: no half-written folder left behind)
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  atomic.replace_folder(tmp, out)  # (a dataset prepared meanwhile by another process: swapped)
  return out


def _write_splits(tmp: Path, folder: Path, splits: tuple[str, ...], langs: tuple[str, str],
                  features, cleaning: CleaningConfig | None, clean_split: str):
  """Writes each split's shards in this process; returns (TFDS SplitInfos, cleaning reports)."""
  split_infos, reports = [], []
  for split in splits:
    pairs = read_parallel(folder, split, langs)
    cleaner = cleaning_lib.Cleaner(cleaning) if cleaning and split == clean_split else None
    if cleaner is not None:
      pairs = (pair for pair in pairs if cleaner.keep(*pair))
    split_infos.append(_write_split(tmp, split, pairs, langs, features))
    if cleaner is not None:
      reports.append(cleaner.report(split, langs, str(folder.resolve())))
  return split_infos, reports


def _clean_key(active: dict) -> str:
  """The part of a prepared corpus's name that says which cleaning rules made it."""
  if not active:
    return ""
  return "_clean" + hashlib.sha1(json.dumps(active, sort_keys=True).encode()).hexdigest()[:8]


def _damage(out: Path) -> str:
  """What is wrong with a prepared local dataset folder (its shards against the metadata it
  records); "" when it is intact."""
  try:
    info = json.loads((out / "dataset_info.json").read_text())
    for split in info["splits"]:
      count = len(split["shardLengths"])
      shards = [out / f"{_NAME}-{split['name']}.array_record-{i:05d}-of-{count:05d}"
                for i in range(count)]
      damage = shard_damage(shards, [int(n) for n in split["shardLengths"]])
      if damage:
        return damage
  except (OSError, ValueError, KeyError) as e:
    return f"unreadable metadata: {e}"
  return ""


def shard_damage(shards, lengths: list[int]) -> str:
  """The first shard that is missing or does not hold the records its dataset records (a
  truncated array_record file reads as fewer), as words; "" when all are whole."""
  for path, expected in zip(shards, lengths):
    path = Path(path)
    if not path.is_file():
      return f"missing {path.name}"
    try:
      reader = array_record_module.ArrayRecordReader(os.fspath(path))
      try:
        found = reader.num_records()
      finally:
        reader.close()
    except Exception as e:  # noqa: BLE001 (array_record raises plain RuntimeErrors and more)
      return f"{path.name} unreadable: {str(e).splitlines()[0][:200]}"
    if found != expected:
      return f"{path.name} holds {found} records, {expected} recorded"
  return ""


def _check_prepared(builder, splits: tuple[str, ...]):
  """A TFDS-prepared dataset's shards of `splits`, checked; a damaged one is a one-line
  error naming the folder (it is not prepared again here: that can mean a large download)."""
  for split in splits:
    if split not in builder.info.splits:
      continue  # (TFDS names the missing split itself)
    info = builder.info.splits[split]
    damage = shard_damage(info.filepaths, info.shard_lengths)
    if damage:
      raise DataError(f"prepared dataset {builder.data_dir} is damaged (split {split!r}: "
                      f"{damage}); remove that folder and rerun to prepare it again (TFDS "
                      "keeps its downloads)")


def serialize_pair(serializer, features, langs: tuple[str, str], a: str, b: str) -> bytes:
  """A pair as a prepared corpus stores it: a TFDS example of its two texts, serialized with
  the feature map in key order (protobuf's default map order differs between processes)."""
  example = serializer.get_tf_example(features.encode_example({langs[0]: a, langs[1]: b}))
  return example.SerializeToString(deterministic=True)


def pair_serializer(features):
  return _tfds().core.example_serializer.ExampleSerializer(features.get_serialized_info())


def shard_path(out: Path, split: str, index: int, count: int) -> Path:
  return out / f"{_NAME}-{split}.array_record-{index:05d}-of-{count:05d}"


def _write_split(out: Path, split: str, pairs: Iterator[tuple[int, str, str]],
                 langs: tuple[str, str], features):
  """Writes one split's pairs as numbered array_record shards; returns its TFDS SplitInfo."""
  serializer = pair_serializer(features)
  lengths: list[int] = []
  writer = None
  for _, a, b in pairs:
    if writer is None or lengths[-1] == PAIRS_PER_SHARD:
      if writer is not None:
        writer.close()
      writer = array_record_module.ArrayRecordWriter(
          os.fspath(out / f"{split}.{len(lengths)}.tmp"), "group_size:1")
      lengths.append(0)
    writer.write(serialize_pair(serializer, features, langs, a, b))
    lengths[-1] += 1
  if writer is None:
    raise DataError(f"no pair of split {split!r} is left after cleaning: see the rules' "
                    "counts above")
  writer.close()
  num_bytes = 0
  for i in range(len(lengths)):  # the TFDS shard names hold the shard count, known only now
    final = shard_path(out, split, i, len(lengths))
    os.replace(out / f"{split}.{i}.tmp", final)
    num_bytes += final.stat().st_size
  return _tfds().core.SplitInfo(name=split, shard_lengths=lengths, num_bytes=num_bytes)


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
  """Where a corpus lives: `dataset` is 'local' (folder of text files) or a TFDS name."""
  dataset: str
  data_dir: str
  source_lang: str
  target_lang: str
  splits: tuple[str, ...]
  cache_dir: str
  cleaning: CleaningConfig | None = None  # rules for the training split of a local corpus
  train_split: str = ""

  @property
  def local_folder(self) -> Path:
    return Path(self.data_dir) if self.data_dir else EMBEDDED_MULTI30K


def corpus_spec(cfg: DataConfig, dataset: str = "") -> CorpusSpec:
  """The corpus of `dataset` (default: the training dataset) with the splits it serves."""
  dataset = dataset or cfg.dataset
  # (with a mixture, config.data's own corpus serves evaluation only)
  splits = [cfg.train_split] if dataset == cfg.dataset and not cfg.corpora else []
  splits += [split for split, ds in ((cfg.eval_split, cfg.eval_dataset),
                                     (cfg.test_split, cfg.test_dataset))
             if split and (ds or cfg.dataset) == dataset]
  return CorpusSpec(dataset, cfg.data_dir, cfg.source_lang, cfg.target_lang,
                    tuple(dict.fromkeys(splits)), cfg.cache_dir or default_cache_dir(),
                    cfg.cleaning, cfg.train_split)


def get_builder(spec: CorpusSpec, write_splits=None):
  """The corpus's TFDS builder, prepared once, cached (`write_splits`: see prepare_local)."""
  with preparation_lock(spec.cache_dir):
    if spec.dataset == "local":
      return _tfds().builder_from_directory(os.fspath(prepare_local(
          spec.local_folder, spec.splits, (spec.source_lang, spec.target_lang), spec.cache_dir,
          spec.cleaning, spec.train_split, write_splits)))
    if spec.cleaning is not None and spec.cleaning.active and spec.train_split in spec.splits:
      raise ConfigError(f"config.data.cleaning applies to local corpora, not to the TFDS "
                        f"dataset {spec.dataset}: turn its rules off (or clean a local copy)")
    builder = _tfds().builder(spec.dataset, data_dir=spec.cache_dir or None)
    builder.download_and_prepare(file_format="array_record")
    _check_prepared(builder, spec.splits)
  return builder


_locks_held: dict[str, int] = {}  # cache folder -> depth of this process's nested holds


@contextlib.contextmanager
def preparation_lock(cache_dir: str):
  """One process at a time prepares datasets in a cache folder (parallel sweep trials, several
  runs on one machine); the others wait, then find the dataset prepared. Re-entrant within a
  process (preparing the tokenized split reads the prepared corpus)."""
  if not cache_dir:
    yield
    return
  key = os.path.abspath(cache_dir)
  if _locks_held.get(key):
    _locks_held[key] += 1
    try:
      yield
    finally:
      _locks_held[key] -= 1
    return
  Path(cache_dir).mkdir(parents=True, exist_ok=True)
  with open(Path(cache_dir) / ".prepare.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    _locks_held[key] = 1
    try:
      yield
    finally:
      _locks_held[key] = 0
      fcntl.flock(lock, fcntl.LOCK_UN)


def get_source(spec: CorpusSpec, split: str):
  """A random-access source of {source_lang: bytes, target_lang: bytes} examples."""
  builder = get_builder(spec)
  return builder.as_data_source(split=split)


def iterate_pairs(spec: CorpusSpec, split: str) -> Iterator[tuple[str, str]]:
  """Yields (source, target) strings of a split, in order."""
  source = get_source(spec, split)
  for start in range(0, len(source), 1024):  # (reading many records at once is much faster)
    for ex in _read_many(source, range(start, min(start + 1024, len(source)))):
      yield as_text(ex[spec.source_lang]), as_text(ex[spec.target_lang])


def _read_many(source, keys: range) -> list:
  try:
    return source.__getitems__(keys)
  except TypeError:  # (TFDS 4.9's mock data source, tfds.testing.mock_data, breaks on it)
    return [source[i] for i in keys]


def as_text(value) -> str:
  """A feature's text (TFDS gives bytes)."""
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)
