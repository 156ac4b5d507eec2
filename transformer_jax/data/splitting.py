r"""Leak-free train/dev/test folders from a corpus of sentence pairs that has no split.

  transformer-jax-split-corpus \\
      --pairs=../shared/data/tatoeba-anki/deu-eng/deu.txt.gz --columns=en,de --group_by=en \\
      --test=de=../shared/data/tatoeba-test/deu-eng/tatoeba-test-v2021-08-07.deu.gz,\\
en=../shared/data/tatoeba-test/deu-eng/tatoeba-test-v2021-08-07.eng.gz \\
      --dedup_test_by=de --out=data/tatoeba-deen

Writes `{train,dev,test}.{lang}.gz` (the local-corpus layout `config.data.data_dir` reads) and
`split.json` with the counts. The rules, for corpora like Tatoeba where one sentence has several
translations and part of the data reappears in public test sets:
- pairs are split by the `--group_by` sentence: all translations of one sentence land in the
  same split (a hash of the sentence and `--seed` decides), so no source leaks from train to dev;
- every pair with a side found in the test set (or in an `--exclude` file) is removed from
  train and dev;
- the test set is copied, deduplicated by its `--dedup_test_by` side (one reference per
  source sentence; the first in file order) or, without it, by identical pairs.
It streams: memory holds the test/exclude sentences only, whatever the corpus size.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from transformer_jax import atomic
from transformer_jax.data.corpus import read_aligned
from transformer_jax.data.text import read_lines
from transformer_jax.errors import DataError, UsageError


def read_pairs(path: Path, columns: int = 2) -> Iterator[list[str]]:
  """Streams the fields of a tab-separated file; a line with another field count is an error."""
  for line_number, line in enumerate(read_lines(path), start=1):
    fields = line.split("\t")
    if len(fields) != columns:
      raise DataError(f"{path}:{line_number}: {len(fields)} tab-separated fields, expected "
                      f"{columns} (the languages of --columns)")
    yield [f.strip() for f in fields]


def in_dev(sentence: str, fraction: float, seed: int) -> bool:
  """Whether a group_by sentence belongs to dev: a stable hash, so no state is kept."""
  digest = hashlib.blake2b(f"{seed}\t{sentence}".encode("utf-8"), digest_size=8).digest()
  return int.from_bytes(digest, "big") < fraction * 2**64


def split_corpus(pairs: list[Path], columns: list[str], out: Path, *, group_by: str = "",
                 dev_fraction: float = 0.01, test: dict[str, Path] | None = None,
                 dedup_test_by: str = "", exclude: list[Path] = (), seed: int = 0) -> dict:
  """Writes the split folder (see the module docstring); returns the counts of split.json."""
  if len(columns) != 2 or columns[0] == columns[1]:
    raise UsageError(f"--columns={','.join(columns)} must name two different languages")
  group_by = group_by or columns[0]
  if group_by not in columns:
    raise UsageError(f"--group_by={group_by} is not one of --columns={','.join(columns)}")
  if not 0 < dev_fraction < 1:
    raise UsageError(f"--dev_fraction={dev_fraction} must be between 0 and 1")
  test = test or {}
  if test and sorted(test) != sorted(columns):
    raise UsageError(f"--test has languages {sorted(test)}, expected {sorted(columns)}")
  if dedup_test_by and dedup_test_by not in columns:
    raise UsageError(f"--dedup_test_by={dedup_test_by} is not one of --columns")
  out.mkdir(parents=True, exist_ok=True)
  counts = collections.Counter()

  held_out: set[str] = set()   # every sentence of the test set and the exclude files
  if test:
    seen = set()
    with _SplitWriter(out, "test", columns) as writer:
      for _, a, b in read_aligned(test[columns[0]], test[columns[1]]):
        pair = (a, b)
        held_out.update(pair)
        key = pair[columns.index(dedup_test_by)] if dedup_test_by else pair
        counts["test_read"] += 1
        if key not in seen:
          seen.add(key)
          writer.write(pair)
    counts["test"] = writer.count
  for path in exclude:
    held_out.update(read_lines(path))

  group_column = columns.index(group_by)
  with _SplitWriter(out, "train", columns) as train, _SplitWriter(out, "dev", columns) as dev:
    for path in pairs:
      for pair in read_pairs(path, len(columns)):
        counts["read"] += 1
        if not all(pair):
          counts["removed_empty_side"] += 1
        elif held_out.intersection(pair):
          counts["removed_in_test"] += 1
        elif in_dev(pair[group_column], dev_fraction, seed):
          dev.write(pair)
        else:
          train.write(pair)
  counts["train"], counts["dev"] = train.count, dev.count
  report = {"counts": dict(counts), "columns": columns, "group_by": group_by,
            "dev_fraction": dev_fraction, "seed": seed, "dedup_test_by": dedup_test_by,
            "pairs": [str(p) for p in pairs], "test": {k: str(v) for k, v in test.items()},
            "exclude": [str(p) for p in exclude]}
  atomic.write_json(out / "split.json", report, indent=2)
  return report


class _SplitWriter:
  """Writes one split's `{split}.{lang}.gz` files atomically (complete, or not there at all)."""

  def __init__(self, out: Path, split: str, langs: list[str]):
    self.paths = [out / f"{split}.{lang}.gz" for lang in langs]
    self.count = 0

  def __enter__(self):
    self.files = [gzip.open(f"{p}.tmp", "wt", encoding="utf-8") for p in self.paths]
    return self

  def write(self, pair):
    for f, text in zip(self.files, pair):
      f.write(text.replace("\n", " ") + "\n")
    self.count += 1

  def __exit__(self, exc_type, *_):
    for f in self.files:
      f.close()
    for p in self.paths:
      if exc_type is None:
        os.replace(f"{p}.tmp", p)
      else:
        os.remove(f"{p}.tmp")


def parse_language_files(value: str) -> dict[str, Path]:
  """{lang: file} from `lang=FILE,lang=FILE` (the --test flag)."""
  test = {}
  for item in filter(None, value.split(",")):
    lang, sep, path = item.partition("=")
    if not sep:
      raise UsageError(f"--test item {item!r} is not lang=file")
    test[lang.strip()] = Path(path.strip())
  return test
