"""The training split as token ids, tokenized once and cached by corpus + tokenizer fingerprint.

Layout of a store folder (`<cache_dir>/tokenized/<fingerprint>/`): for each side (`source`,
`target`) a flat file of every pair's ids in corpus order (`<side>.ids`: uint16 when the
vocabulary fits, else int32; EOS included, as `Tokenizer.encode` gives them) and their offsets
(`<side>.offsets`: int64, pairs + 1 of them), plus `meta.json`. Any pair is read in O(1) at any
corpus size: two offsets and its ids, each with one `pread`. (Not through a memory map: for each
page a random read faults in, the kernel maps the pages around it too, "fault-around", 64 KB,
so resident memory grew with the corpus (BENCHMARKS.md, "An input pipeline for
accelerators"); with pread it holds what a read returns.) The store is written streamed
(bounded memory), under its final name only when complete: an interrupted write is redone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import numpy as np

from transformer_jax.config.sections import DataConfig
from transformer_jax.data import corpus
from transformer_jax.data.tokenizer import SIDES, Tokenizer
from transformer_jax.errors import DataError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_BLOCK = 4096  # pairs tokenized per SentencePiece call (its threads work on one block)

# Filter codes of a pair, as the text pipeline decides them (EOS counted in the lengths).
KEEP, EMPTY, TOO_LONG = 0, 1, 2


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
  """A tokenized split on disk."""
  folder: Path
  num_pairs: int
  id_dtype: str

  def lengths(self, side: str, start: int = 0, stop: int | None = None) -> np.ndarray:
    """Token counts (EOS included) of pairs start..stop (read in one sequential piece)."""
    stop = self.num_pairs if stop is None else stop
    return np.diff(np.fromfile(self.folder / f"{side}.offsets", np.int64,
                               count=stop - start + 1, offset=8 * start))

  def bounds(self, side: str, indices) -> tuple[np.ndarray, np.ndarray]:
    """(first, end) positions in `<side>.ids` of the pairs `indices`: two offsets each."""
    with open(self.folder / f"{side}.offsets", "rb", buffering=0) as f:
      fd = f.fileno()
      both = np.frombuffer(b"".join([os.pread(fd, 16, 8 * int(i)) for i in indices]), np.int64)
    return both[0::2], both[1::2]

  def read_ids(self, side: str, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The ids between each of `starts` and `ends` (from `bounds`), concatenated, as int32."""
    size = np.dtype(self.id_dtype).itemsize
    with open(self.folder / f"{side}.ids", "rb", buffering=0) as f:
      fd = f.fileno()
      data = b"".join([os.pread(fd, int(n) * size, int(a) * size)
                       for a, n in zip(starts, ends - starts)])
    return np.frombuffer(data, self.id_dtype).astype(np.int32)


def filter_codes(src_len: np.ndarray, tgt_len: np.ndarray, cfg: DataConfig,
                 source_extra: int = 0) -> np.ndarray:
  """KEEP, EMPTY (a side is EOS only) or TOO_LONG for each pair, as the text pipeline filters;
  sources are `source_extra` tokens (a tag) longer in the batches than `src_len` counts."""
  codes = np.full(len(src_len), KEEP, np.int8)
  codes[(src_len + source_extra > cfg.max_source_length)
        | (tgt_len > cfg.max_target_length)] = TOO_LONG
  codes[(src_len <= 1) | (tgt_len <= 1)] = EMPTY
  return codes


def count_codes(split: TokenizedSplit, cfg: DataConfig, shard: slice = slice(None),
                block: int = 1 << 16, source_extra: int = 0) -> np.ndarray:
  """How many pairs of `shard` each filter code has (read in blocks: bounded memory), each
  source `source_extra` tokens longer than stored (a tag)."""
  counts = np.zeros(3, np.int64)
  step = shard.step or 1
  for start in range(0, split.num_pairs, block):
    stop = min(start + block, split.num_pairs)
    codes = filter_codes(split.lengths("source", start, stop),
                         split.lengths("target", start, stop), cfg, source_extra)
    first = ((shard.start or 0) - start) % step  # (the shard's first pair in this block)
    counts += np.bincount(codes[first::step], minlength=3)
  return counts


def fingerprint(spec: corpus.CorpusSpec, split: str, tokenizer: Tokenizer) -> str:
  """What the ids depend on: the prepared corpus (its folder and size) and the tokenizer."""
  builder = corpus.get_builder(spec)
  num_pairs = len(builder.as_data_source(split=split))
  key = (f"v{FORMAT_VERSION}|{Path(builder.data_dir).resolve()}|{split}|{num_pairs}|"
         f"{spec.source_lang}>{spec.target_lang}|{tokenizer.fingerprint}")
  return hashlib.sha256(key.encode()).hexdigest()[:16]


def tokenized_split(spec: corpus.CorpusSpec, tokenizer: Tokenizer, write_ids=None
                    ) -> TokenizedSplit:
  """The training split of `spec` (its `train_split`) as token ids, written on first use (by
  `write_ids`: default `_write_ids`, in this process; `data.apache_beam_prep.beam_tokenizer`: a
  Beam pipeline writing the same files)."""
  split = spec.train_split
  fp = fingerprint(spec, split, tokenizer)  # (prepares the corpus, under the lock, first)
  folder = Path(spec.cache_dir) / "tokenized" / fp
  with corpus.preparation_lock(spec.cache_dir):
    if not (folder / "meta.json").is_file():
      _write(folder, spec, split, tokenizer, fp, write_ids or _write_ids)
  return _open(folder)


def _open(folder: Path) -> TokenizedSplit:
  try:
    meta = json.loads((folder / "meta.json").read_text())
    store = TokenizedSplit(folder, int(meta["num_pairs"]), str(meta["id_dtype"]))
    for side in SIDES:
      expected = (store.num_pairs + 1) * 8
      if (folder / f"{side}.offsets").stat().st_size != expected:
        raise ValueError(f"{side}.offsets is not {expected} bytes")
  except (OSError, ValueError, KeyError) as e:
    raise DataError(f"tokenized data in {folder} is damaged ({e}); delete the folder to "
                    "tokenize again") from None
  return store


def _write(folder: Path, spec: corpus.CorpusSpec, split: str, tokenizer: Tokenizer, fp: str,
           write_ids):
  """Tokenizes `split` into `folder`, streamed, with progress in the log (the caller holds the
  preparation lock; the corpus is prepared already, so reading it takes no lock)."""
  start, total = time.perf_counter(), len(corpus.get_source(spec, split))
  id_dtype = "uint16" if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else "int32"
  folder.parent.mkdir(parents=True, exist_ok=True)
  for stale in folder.parent.glob(f".incomplete-{fp}-*"):  # (callers hold the lock)
    shutil.rmtree(stale)
  tmp = folder.with_name(f".incomplete-{fp}-{os.getpid()}")
  tmp.mkdir()
  try:
    done, ends = write_ids(tmp, spec, split, tokenizer, total, id_dtype)
    (tmp / "meta.json").write_text(json.dumps(
        {"format_version": FORMAT_VERSION, "num_pairs": done, "id_dtype": id_dtype,
         "tokenizer": tokenizer.fingerprint, "dataset": spec.dataset, "split": split,
         "languages": [spec.source_lang, spec.target_lang],
         "tokens": {side: ends[side] for side in SIDES}}, indent=1))
  except BaseException:  # (a bad file, an interrupt: no half-written folder left behind)
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  shutil.rmtree(folder, ignore_errors=True)
  os.replace(tmp, folder)
  log.info("tokenized %s once: %d pairs, %d + %d tokens in %.1f s, cached in %s", split, done,
           ends["source"], ends["target"], time.perf_counter() - start, folder)


def _write_ids(tmp: Path, spec: corpus.CorpusSpec, split: str, tokenizer: Tokenizer, total: int,
               id_dtype: str) -> tuple[int, dict[str, int]]:
  """Streams the split's ids and offsets into `tmp`; returns (pairs, tokens per side)."""
  ends = dict.fromkeys(SIDES, 0)
  start, done, last_log = time.perf_counter(), 0, 0.0
  block: list[tuple[str, str]] = []
  with contextlib.ExitStack() as stack:
    files = {f"{side}.{kind}": stack.enter_context(open(tmp / f"{side}.{kind}", "wb"))
             for side in SIDES for kind in ("ids", "offsets")}
    for side in SIDES:
      files[f"{side}.offsets"].write(np.zeros(1, np.int64).tobytes())

    def flush():
      for side, texts in zip(SIDES, zip(*block)):
        ids = tokenizer.encode_batch(list(texts), side)
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        files[f"{side}.ids"].write(np.fromiter((i for seq in ids for i in seq), id_dtype,
                                               int(lengths.sum())).tobytes())
        files[f"{side}.offsets"].write((ends[side] + np.cumsum(lengths)).tobytes())
        ends[side] += int(lengths.sum())
      block.clear()

    for pair in corpus.iterate_pairs(spec, split):
      block.append(pair)
      done += 1
      if len(block) == _BLOCK:
        flush()
        if time.perf_counter() - last_log > 30:
          last_log = time.perf_counter()
          rate = done / max(last_log - start, 1e-9)
          log.info("tokenizing %s: %d/%d pairs (%.0f pairs/s, ETA %.0f s)", split, done, total,
                   rate, (total - done) / rate)
    if block:
      flush()
  return done, ends
