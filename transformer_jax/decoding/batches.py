"""Decoding whole sets: every sentence a `scheduler.Sentence` with its cap and settings,
decoded in flight longest first in slots split over the mesh's batch axes, turned back into
text in input order."""

from __future__ import annotations

import collections
import zlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config.sections import DecodeConfig
from transformer_jax.data.tokenizer import EOS_ID, content_ids
from transformer_jax.decoding import scheduler, width_classes
from transformer_jax.decoding.mbr import mbr_chosen
from transformer_jax.ops.masking import NEG_INF
from transformer_jax.parallel import mesh as mesh_lib


def sentence_caps(cfg: DecodeConfig, inputs_BS: np.ndarray, prefixes_BP: np.ndarray | None,
                  model_max_len: int) -> np.ndarray:
  """Each sentence's length cap (`caps_of_lengths`) from its padded ids (0: padding)."""
  return caps_of_lengths(cfg, (inputs_BS > 0).sum(axis=1),
                         None if prefixes_BP is None else (prefixes_BP > 0).sum(axis=1),
                         model_max_len)


def caps_of_lengths(cfg: DecodeConfig, source_lengths, prefix_lengths, model_max_len: int
                    ) -> np.ndarray:
  """Each sentence's length cap: min(max_length, a * its source length + b), at least its
  forced prefix and EOS, at most the model's positions; 0 for an empty (padding) row."""
  lengths = np.asarray(source_lengths)
  caps = np.array([min(cfg.length_limit(int(n)), model_max_len) for n in lengths], np.int32)
  if prefix_lengths is not None:
    caps = np.minimum(np.maximum(caps, np.asarray(prefix_lengths) + 1), model_max_len)
  return np.where(lengths > 0, caps, 0).astype(np.int32)


def slot_options(cfg: DecodeConfig) -> dict:
  """Each sentence's runtime settings in the slots (`slots.SlotOptions`) for `cfg`."""
  return dict(alpha=cfg.length_penalty,
              num_return=cfg.mbr_candidates if cfg.mbr and not cfg.sampling else cfg.nbest,
              min_len=cfg.min_length, beams=cfg.beam_size,
              repetition_penalty=cfg.repetition_penalty,
              no_repeat_ngram=cfg.no_repeat_ngram_size, sample=cfg.sampling,
              temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p)


def draws(cfg: DecodeConfig) -> int:
  """Rows per sentence: its samples (MBR over samples), else 1."""
  return cfg.mbr_candidates if cfg.sampling and cfg.mbr else 1


def candidates(cfg: DecodeConfig) -> int:
  """Hypotheses per sentence a search returns: the n-best, or MBR's candidates."""
  return cfg.mbr_candidates if cfg.mbr else cfg.nbest


CPU_SLOTS = 32  # `slot_count`'s auto on a CPU: the fastest of those measured (BENCHMARKS.md,
# "Decoding in flight": fewer slots beside the few long sentences that hold a wide cache)


def slot_count(cfg: DecodeConfig) -> int:
  """Sentences decoded at once: `cfg.slots`, or (0, auto) CPU_SLOTS on a CPU and
  `cfg.batch_size` on an accelerator."""
  if cfg.slots:
    return cfg.slots
  return min(cfg.batch_size, CPU_SLOTS) if jax.default_backend() == "cpu" else cfg.batch_size


def asks_options(cfg: DecodeConfig) -> bool:
  """Whether `cfg` asks for a rule or sampling: the work that slots for a file's settings
  alone compile in only then (`slots.Slots.every_option`)."""
  return cfg.sampling or cfg.repetition_penalty != 1.0 or cfg.no_repeat_ngram_size > 0


def decoder(scorer, cfg: DecodeConfig, mesh=None, every_option: bool | None = None,
            arrival_order: bool = False) -> scheduler.Decoder:
  """The slots that decode with `cfg`: `slot_count` sentences (times their samples, a
  row each; a multiple of the mesh's data-parallel size), beam search of `cfg.beam_size`
  beams or greedy/sampling rows, the width classes of the model's positions (narrower ones
  for slots fed in `arrival_order`, a server's: `width_classes`). Requests whose settings
  change no shape (`slot_options`) share them when `every_option` (a server's slots); None:
  the rules and sampling compiled in where `cfg` asks for them."""
  rows = slot_count(cfg) * draws(cfg)
  if mesh is not None:
    rows = mesh_lib.round_up_to_data_parallel(rows, mesh)
  max_positions = scorer.max_len  # (a cap may reach it: a forced prefix raises caps)
  geometry = width_classes.geometry(rows, max_positions, max_positions, smallest=(
      width_classes.ARRIVAL_ORDER_SMALLEST_WIDTH if arrival_order
      else width_classes.SMALLEST_WIDTH))
  beam_size = 0 if cfg.greedy or cfg.sampling else cfg.beam_size
  every_option = asks_options(cfg) if every_option is None else every_option
  return scheduler.Decoder(scorer, geometry, beam_size, cfg.beam_impl, mesh, every_option)


def sentences(eval_set, cfg: DecodeConfig, max_positions: int, deliver,
              longest_first: bool = True) -> list:
  """`eval_set`'s sources as `scheduler.Sentence`s, longest first (or in their order: a
  server's arrivals), each sample of a sentence its own, its key made from the seed and the
  sentence's own ids (a sample depends on neither its neighbours nor its place in the
  input); `deliver(index, draw, seqs, scores)`."""
  options, n = slot_options(cfg), draws(cfg)
  sources = [np.asarray(x[:max_positions], np.int32) for x in eval_set.source_ids]
  prefixes = eval_set.prefix_ids
  caps = caps_of_lengths(cfg, [len(x) for x in sources],
                         None if prefixes is None else [len(p) for p in prefixes],
                         max_positions)
  keys = None
  if cfg.sampling:  # (draw n of a sentence: the seed folded with its ids' hash, then n)
    ids = [zlib.crc32(np.asarray(x, "<i4").tobytes()) for x in eval_set.source_ids]
    base = jax.random.PRNGKey(cfg.seed)
    keys = np.asarray(jax.vmap(lambda i, d: jax.random.fold_in(jax.random.fold_in(base, i), d))(
        jnp.asarray(np.repeat(ids, n), jnp.uint32), jnp.tile(jnp.arange(n), len(ids))),
        np.uint32).reshape(len(ids), n, 2)
  order = range(len(sources))
  if longest_first:
    order = sorted(order, key=lambda i: (-len(sources[i]), i))
  return [scheduler.Sentence(
      source=sources[i], cap=int(caps[i]), options=options,
      prefix=None if prefixes is None else np.asarray(prefixes[i][:max_positions], np.int32),
      key=None if keys is None else keys[i, d],
      deliver=lambda seqs, scores, i=i, d=d: deliver(i, d, seqs, scores))
      for i in order for d in range(n)]


class Gathered:
  """The results of a set's sentences as they are delivered: each sentence's (sequences
  (N, L), scores (N,)), N = the candidates asked for (cfg.nbest, or cfg.mbr_candidates with
  MBR), best first for beam search; `on_done(i)` once sentence i has all of them."""

  def __init__(self, cfg: DecodeConfig, size: int, on_done=None):
    self.draws, self.kept, self.on_done = draws(cfg), candidates(cfg), on_done
    self.results: list = [None] * size
    self.waiting = size
    self._parts: dict = {}

  def deliver(self, i: int, d: int, seqs, scores):
    if self.draws == 1:
      self.results[i] = ((seqs[:self.kept], scores[:self.kept]) if seqs.ndim == 2
                         else (seqs[None], scores[None]))
    else:  # (a sample per row: the sentence's draws gathered)
      self._parts.setdefault(i, {})[d] = (seqs, scores)
      if len(self._parts[i]) < self.draws:
        return
      drawn = self._parts.pop(i)
      self.results[i] = (np.stack([drawn[k][0] for k in range(self.draws)]),
                         np.stack([drawn[k][1] for k in range(self.draws)]))
    self.waiting -= 1
    if self.on_done is not None:
      self.on_done(i)


def decode_set(scorer, eval_set, cfg: DecodeConfig, mesh=None, on_done=None, decoder_=None):
  """Decodes every source of `eval_set` in flight (`scheduler`), longest first; returns, in
  its order, each one's (sequences, scores) (`Gathered`). `scorer`: the model's decoding
  interface (one model's or an ensemble's, made ready once: `ensemble.prepare`); the set's
  target prefixes, if any, are forced; each sentence has its own length cap
  (`caps_of_lengths`), so its translation depends on nothing else in the set. `on_done(i)`
  once sentence i is done (e.g. a progress bar's update); `decoder_`: the slots to decode
  in (`decoder`; default: made for `cfg`)."""
  decoder_ = decoder_ or decoder(scorer, cfg, mesh)
  gathered = Gathered(cfg, len(eval_set), on_done)
  queue = collections.deque(sentences(eval_set, cfg, scorer.max_len, gathered.deliver))
  # (every program known before the first sentence: the widest class's first, the narrower
  # ones ready by the time the slots narrow, while the wider ones decode)
  decoder_.prepare(*decoder_.programs_of(list(queue)), wait=False)
  try:
    decoder_.run(queue)
  finally:
    decoder_.cancel_pending()  # (programs of classes it never reached, e.g. stopped early)
  return gathered.results


class Hypothesis(NamedTuple):
  """A translation: its text, its score (beam: length-normalised; greedy and sampling: the
  total log-probability), the ids the search produced (up to EOS, padding dropped) and
  whether it ended with EOS (False: its sentence's length cap stopped it)."""
  text: str
  score: float
  ids: tuple[int, ...]
  ended: bool = True


def hypotheses(seqs, scores, tokenizer, cfg: DecodeConfig) -> list[Hypothesis]:
  """A sentence's n-best as `Hypothesis`es from its sequences and scores (`Gathered`), the
  candidates reordered by MBR's expected utility where `cfg` asks (their scores kept)."""
  hyps = [Hypothesis(tokenizer.detokenize(seqs[n]), float(scores[n]),
                     tuple(content_ids(seqs[n])), bool((seqs[n] == EOS_ID).any()))
          for n in range(seqs.shape[0]) if scores[n] > NEG_INF / 2]
  return mbr_chosen(hyps, cfg.mbr, cfg.nbest) if cfg.mbr else hyps


def translate_nbest(scorer, eval_set, tokenizer, cfg: DecodeConfig, mesh=None,
                    on_batch=None, decoder_=None) -> list[list[Hypothesis]]:
  """For every source, in order: its `cfg.nbest` hypotheses, best first. `on_batch(n)` (e.g.
  a progress bar's update) is called as sentences are done; `decoder_` as for
  `decode_set`."""
  done = None if on_batch is None else (lambda i: on_batch(1))
  return [hypotheses(seqs, scores, tokenizer, cfg)
          for seqs, scores in decode_set(scorer, eval_set, cfg, mesh, done, decoder_)]
