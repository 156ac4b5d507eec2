"""Packing pre-tokenized pairs into fixed-shape batches, first-fit, with numpy.

The input is a grain IterDataset of chunks: consecutive stretches of the shuffled pair stream,
each a dict with the pairs' filter codes (`tokenized.KEEP`, ...) and the kept pairs' lengths and
flat ids. Pairs are taken in stream order and each goes into the first row with room on both
sides; a batch is complete when the next pair fits no row (that pair opens the next batch), as
grain's FirstFitPackIterDataset does, without its per-token Python work. Rows hold `inputs`,
`targets`, their `*_positions` (restarting at 0 in every pair) and `*_segment_ids` (1, 2, ... per
row; 0 is padding), all int32, plus the batch's counts of filtered pairs (`STATS_KEYS`) and,
for a mixture (chunks with each pair's `corpus`), the pairs drawn from each corpus and the
tokens it put into the batch (`CORPUS_KEYS`).

The iterator's state is the chunk iterator's state before the current chunk and the position in
it, so a restored iterator makes exactly the batches that would have followed.
"""

from __future__ import annotations

import grain
import numpy as np

from transformer_jax.data.tokenized import EMPTY, KEEP, TOO_LONG

# Per-batch counts of the pairs the batch consumed from the stream (0-d int64 arrays).
STATS_KEYS = ("pairs_kept", "pairs_empty", "pairs_too_long")
# ... and of a mixture, per corpus (int64 arrays, one entry per corpus).
CORPUS_KEYS = ("corpus_pairs", "corpus_tokens")


def chunk(codes: np.ndarray, src: tuple[np.ndarray, np.ndarray],
          tgt: tuple[np.ndarray, np.ndarray], corpus: np.ndarray | None = None
          ) -> dict[str, np.ndarray]:
  """A chunk of the stream: `codes` of all its pairs, (flat ids, lengths) of the kept ones;
  in a mixture, the `corpus` index of each of its pairs."""
  out = {"codes": codes, "src_ids": src[0], "src_len": src[1], "tgt_ids": tgt[0],
         "tgt_len": tgt[1]}
  if corpus is not None:
    out["corpus"] = corpus
  return out


class PackedBatches(grain.IterDataset):
  """Batches of `rows` rows of `lengths` = (source, target) tokens from a chunk dataset."""

  def __init__(self, parent: grain.IterDataset, rows: int, lengths: tuple[int, int],
               num_corpora: int = 0):
    super().__init__(parent)
    self.rows, self.lengths, self.num_corpora = rows, lengths, num_corpora

  def __iter__(self) -> _PackedIterator:
    return _PackedIterator(self._parent.__iter__(), self.rows, self.lengths, self.num_corpora)

  def __str__(self) -> str:
    return f"PackedBatches(rows={self.rows}, lengths={self.lengths})"


class _Chunk:
  """A chunk being consumed: its data, where it starts in the parent, and the kept pairs'
  positions and id offsets."""

  def __init__(self, data: dict, parent_state):
    self.data, self.parent_state = data, parent_state
    self.kept = np.flatnonzero(data["codes"] == KEEP)
    self.src_start = np.cumsum(data["src_len"]) - data["src_len"]
    self.tgt_start = np.cumsum(data["tgt_len"]) - data["tgt_len"]
    self.src_len = data["src_len"].tolist()  # (Python ints: the packing loop reads them one
    self.tgt_len = data["tgt_len"].tolist()  # at a time)
    if "corpus" in data:
      self.kept_corpus = data["corpus"][self.kept]
      self.kept_tokens = data["src_len"] + data["tgt_len"]

  @property
  def size(self) -> int:
    return len(self.data["codes"])


class _PackedIterator(grain.DatasetIterator):

  def __init__(self, parent: grain.DatasetIterator, rows: int, lengths: tuple[int, int],
               num_corpora: int = 0):
    super().__init__(parent)
    self.rows, self.lengths, self.num_corpora = rows, lengths, num_corpora
    self._chunk: _Chunk | None = None
    self._position = 0   # the next pair of the current chunk
    self._next_kept = 0  # ... and the index of the next kept pair in it

  def _read_chunk(self):
    state = self._parent.get_state()
    self._chunk = _Chunk(next(self._parent), state)
    self._position = self._next_kept = 0

  def __next__(self) -> dict[str, np.ndarray]:
    rows, (max_src, max_tgt) = self.rows, self.lengths
    free_src, free_tgt = np.full(rows, max_src), np.full(rows, max_tgt)
    used_segments = np.zeros(rows, np.int64)
    placed = []  # per chunk touched: (chunk, kept indices, rows, src offsets, tgt offsets, segs)
    codes_seen = np.zeros(3, np.int64)
    drawn, tokens = np.zeros(self.num_corpora, np.int64), np.zeros(self.num_corpora, np.int64)
    while True:
      if self._chunk is None or self._position == self._chunk.size:
        self._read_chunk()
      c = self._chunk
      picks, at_row, at_src, at_tgt, seg = [], [], [], [], []
      full = False
      while self._next_kept < len(c.kept):
        k = self._next_kept
        n_src, n_tgt = c.src_len[k], c.tgt_len[k]
        fits = (free_src >= n_src) & (free_tgt >= n_tgt)
        row = int(fits.argmax())
        if not fits[row]:
          full = True
          break
        picks.append(k)
        at_row.append(row)
        at_src.append(max_src - free_src[row])
        at_tgt.append(max_tgt - free_tgt[row])
        used_segments[row] += 1
        seg.append(used_segments[row])
        free_src[row] -= n_src
        free_tgt[row] -= n_tgt
        self._next_kept += 1
      # Every pair up to the one that did not fit (or to the chunk's end) is consumed.
      end = c.kept[self._next_kept] if full else c.size
      codes_seen += np.bincount(c.data["codes"][self._position:end], minlength=3)
      if self.num_corpora:
        drawn += np.bincount(c.data["corpus"][self._position:end], minlength=self.num_corpora)
        if picks:
          tokens += np.bincount(c.kept_corpus[picks], c.kept_tokens[picks],
                                self.num_corpora).astype(np.int64)
      self._position = end
      if picks:
        placed.append((c, np.asarray(picks), np.asarray(at_row), np.asarray(at_src),
                       np.asarray(at_tgt), np.asarray(seg)))
      if full:
        break
    batch = _assemble(placed, rows, self.lengths)
    for key, code in zip(STATS_KEYS, (KEEP, EMPTY, TOO_LONG)):
      batch[key] = np.asarray(codes_seen[code], np.int64)
    if self.num_corpora:
      batch["corpus_pairs"], batch["corpus_tokens"] = drawn, tokens
    return batch

  def get_state(self) -> dict:
    if self._chunk is None:
      return {"parent": self._parent.get_state(), "position": 0}
    return {"parent": self._chunk.parent_state, "position": int(self._position)}

  def set_state(self, state: dict):
    self._parent.set_state(state["parent"])
    self._chunk = None
    if state["position"]:
      self._read_chunk()
      self._position = int(state["position"])
      self._next_kept = int(np.searchsorted(self._chunk.kept, self._position))

  def __str__(self) -> str:
    return f"PackedBatchesIterator(rows={self.rows}, lengths={self.lengths})"


def _assemble(placed: list, rows: int, lengths: tuple[int, int]) -> dict[str, np.ndarray]:
  """The batch arrays of the placed pairs (vectorised over their tokens)."""
  batch = {}
  for side, max_len, col, ids_key, len_key, start_attr in (
      ("inputs", lengths[0], 3, "src_ids", "src_len", "src_start"),
      ("targets", lengths[1], 4, "tgt_ids", "tgt_len", "tgt_start")):
    tokens = np.zeros(rows * max_len, np.int32)
    positions = np.zeros(rows * max_len, np.int32)
    segments = np.zeros(rows * max_len, np.int32)
    for entry in placed:
      c, picks, at_row, segs = entry[0], entry[1], entry[2], entry[5]
      n = c.data[len_key][picks]
      within = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
      dest = np.repeat(at_row * max_len + entry[col], n) + within
      tokens[dest] = c.data[ids_key][np.repeat(getattr(c, start_attr)[picks], n) + within]
      positions[dest] = within
      segments[dest] = np.repeat(segs, n)
    batch[side] = tokens.reshape(rows, max_len)
    batch[f"{side}_positions"] = positions.reshape(rows, max_len)
    batch[f"{side}_segment_ids"] = segments.reshape(rows, max_len)
  return batch
