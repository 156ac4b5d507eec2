"""The one door into decoding: an `Engine` takes sentences (or a tokenized set) and gives each
one's n-best. Validation, `evaluate`, `translate`, `translate-corpus`, `serve`, the compile
tool and the benchmarks all decode through it; our search (`SearchEngine`) and CTranslate2
(`interop.engines.Ctranslate2Engine`) implement it.

An engine states what it can do: the decoding options it honours are read from their
declarations (`config.fields.Option`; one it cannot honour is refused in one line naming
option and engine), and whether a call's seed decides its samples (`seeds_each_call`).
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import sys
from typing import ClassVar

import jax
import jaxlib
import numpy as np
from tqdm import tqdm

from transformer_jax.config.fields import check_honoured
from transformer_jax.config.sections import DecodeConfig
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.data.tokenizer import EOS_ID, UNK_ID, Tokenizer
from transformer_jax.decoding import scheduler, stream
from transformer_jax.decoding.batches import (
  Gathered,
  Hypothesis,
  asks_options,
  decoder,
  draws,
  hypotheses,
  slot_count,
  translate_nbest,
)
from transformer_jax.decoding.batches import sentences as sentences_of
from transformer_jax.errors import UsageError

log = logging.getLogger(__name__)


class Engine(abc.ABC):
  """Sentences in, each one's n-best translations out (`Hypothesis`: text, score, ids,
  whether it ended), with `decode`'s settings or a call's own."""
  name: ClassVar[str]                    # what `--engine` calls it
  seeds_each_call: ClassVar[bool] = True  # a call's `seed` decides its samples
  tokenizer: Tokenizer
  decode: DecodeConfig                   # the settings a call without its own decodes with
  max_len: int                           # the longest source it reads (longer ones are cut)
  source_prefix: tuple[int, ...] = ()    # ids before every source (a tag's), or none

  @abc.abstractmethod
  def translate_set(self, eval_set: EvalSet, decode: DecodeConfig | None = None,
                    on_batch=None) -> list[list[Hypothesis]]:
    """The n-best of every source of `eval_set`, in its order (its prefixes forced, if it has
    any); `on_batch(n)` after each n sentences (e.g. a progress bar's update)."""

  @abc.abstractmethod
  def warm_up(self):
    """Prepares what the first short sentences need (programs, kernels) before they come."""

  def close(self):
    """Stops the engine's threads of its own (if any) once what they hold is done."""

  @property
  def label(self) -> str:
    """What a record says decoded ("jax"; another engine with its numerics, e.g.
    "ctranslate2:bfloat16")."""
    return self.name

  def settings(self, decode: DecodeConfig) -> dict | None:
    """What the engine runs for `decode` where it is not `decode` itself (results.json's
    `engine_settings`); None: `decode` is all."""
    return None

  @classmethod
  def check(cls, decode: DecodeConfig):
    """A ConfigError naming the first of `decode`'s options this engine cannot honour at its
    value (as the options' declarations say); before one is made, too."""
    check_honoured(decode, cls.name, "decode")

  @staticmethod
  def best_only(decode: DecodeConfig) -> DecodeConfig:
    """`decode` searching for one translation of each source (`nbest` 1): what
    `translate_best` decodes with."""
    return dataclasses.replace(decode, nbest=1)

  def translate_best(self, eval_set: EvalSet, decode: DecodeConfig | None = None,
                     on_batch=None) -> list[Hypothesis]:
    """The best translation of every source of `eval_set`, in its order (`best_only`), an
    empty text where none ended (what validation and `evaluate` score)."""
    return [hyps[0] if hyps else Hypothesis("", 0.0, ()) for hyps in
            self.translate_set(eval_set, self.best_only(decode or self.decode), on_batch)]

  def translate(self, sentences: list[str], prefixes: list[str] | None = None,
                seed: int | None = None, decode: DecodeConfig | None = None,
                progress: bool = False) -> list[list[Hypothesis]]:
    """N-best lists, in input order; empty sentences give []. With `prefixes`
    (line-aligned; "" = none) each translation starts with its prefix; `seed`: sampling's,
    instead of the settings'; `decode`: settings instead of the engine's (a request's)."""
    decode = decode or self.decode
    self.check(decode)
    if seed is not None and decode.sampling:
      if not self.seeds_each_call:
        raise UsageError(f"--engine={self.name} samples from one seed per process: a seed "
                         "per request or block, as the server and translate-corpus give, "
                         "needs our search (--engine=jax)")
      decode = dataclasses.replace(decode, seed=seed)
    results: list[list[Hypothesis]] = [[] for _ in sentences]
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    if not todo:
      return results
    eval_set = EvalSet.from_pairs([sentences[i] for i in todo], [], self.tokenizer,
                                  self.source_prefix)
    if prefixes is not None:
      eval_set = eval_set.with_prefixes([prefixes[i] for i in todo], self.tokenizer)
    if max(len(x) for x in eval_set.source_ids) > self.max_len:
      log.warning("inputs longer than %d subwords are truncated", self.max_len)
    bar = tqdm(total=len(todo), unit="sent", file=sys.stderr) if progress else None
    nbest = self.translate_set(eval_set, decode, None if bar is None else bar.update)
    if bar is not None:
      bar.close()
    for position, hyps in zip(todo, nbest):
      results[position] = hyps
    return results


LOOP_WRITE_REGRESSION_SINCE = (0, 11, 1)  # jaxlib versions (jax #40101)
_noted: list[str] = []


def note_loop_write_regression(backend: str | None = None, version: str | None = None):
  """Says once per process, on a CPU, that the installed jaxlib is of the versions whose
  XLA:CPU may copy a whole buffer at each small in-loop write (jax #40101, open since 0.11.1):
  decoding writes a token column a step."""
  backend = backend or jax.default_backend()
  version = version or jaxlib.__version__
  release = tuple(int(p) for p in version.split(".")[:3] if p.isdigit())
  if backend != "cpu" or release < LOOP_WRITE_REGRESSION_SINCE or version in _noted:
    return
  _noted.append(version)
  log.warning("jaxlib %s on a CPU: since 0.11.1 XLA:CPU may copy a whole buffer at each small "
              "in-loop write (jax #40101), which decoding does every step; "
              "`python benchmarks/dus_regression.py` tells whether this one does", version)


class SearchEngine(Engine):
  """Our search (`decoding.search`) over a model made ready to decode (`ensemble.prepare`:
  one model or an ensemble), on `mesh` (None: one device)."""
  name = "jax"

  def __init__(self, scorer, tokenizer: Tokenizer, decode: DecodeConfig, mesh=None,
               source_prefix: tuple[int, ...] | list[int] = ()):
    # (on one device its arrays placed plainly, so that the slots a program returns are
    # placed as those it was given and the next call on them is the same program; an abstract
    # model, the compile tool's, as given)
    if mesh is not None and mesh.size == 1 and all(
        isinstance(x, jax.Array) for x in jax.tree_util.tree_leaves(scorer)):
      scorer, mesh = jax.device_put(scorer, mesh.devices.flat[0]), None
    self.scorer, self.tokenizer, self.decode, self.mesh = scorer, tokenizer, decode, mesh
    note_loop_write_regression()
    self.max_len = scorer.max_len
    self.source_prefix = tuple(source_prefix)
    self._decoders: dict = {}
    self._streams: dict = {}

  def translate_set(self, eval_set, decode=None, on_batch=None):
    decode = decode or self.decode
    self.check(decode)
    return translate_nbest(self.scorer, eval_set, self.tokenizer, decode, self.mesh,
                           on_batch, self.set_decoder(decode))

  def warm_up(self):
    """Translates two made-up sources, one in each of the two narrowest width classes, so
    that the programs a line typed interactively needs are traced, and compiled or loaded
    from the program store, while the answer to the first line is read."""
    narrowest = self.set_decoder().geometry.widths[0]
    for n in (1, narrowest):  # (n tokens, the prefix and EOS: the second one class wider)
      source = np.asarray(list(self.source_prefix) + [UNK_ID + 1] * n + [EOS_ID], np.int32)
      self.translate_set(EvalSet([""], [""], [source], [source]))

  def submit(self, sentences: list[str], prefixes: list[str] | None, seed: int | None,
             decode: DecodeConfig | None, done) -> list[scheduler.Sentence]:
    """`translate` without waiting: the sentences join the queue of the in-flight slots
    (`stream.Stream`, one per shape of decoding) in arrival order, and `done(n-best
    lists)` is called (on the decoding thread) once all are done, or `done(error)`. Returns
    what a client that leaves may cancel (`scheduler.Sentence.cancelled`)."""
    decode = decode or self.decode
    self.check(decode)
    if seed is not None and decode.sampling:
      decode = dataclasses.replace(decode, seed=seed)
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    results: list[list[Hypothesis]] = [[] for _ in sentences]
    if not todo:
      done(results)
      return []
    eval_set = EvalSet.from_pairs([sentences[i] for i in todo], [], self.tokenizer,
                                  self.source_prefix)
    if prefixes is not None:
      eval_set = eval_set.with_prefixes([prefixes[i] for i in todo], self.tokenizer)
    answered = []

    def finished(_):
      if gathered.waiting == 0 and not answered:
        answered.append(True)
        for i, (seqs, scores) in zip(todo, gathered.results):
          results[i] = hypotheses(seqs, scores, self.tokenizer, decode)
        done(results)

    def failed(error):
      if not answered:
        answered.append(True)
        done(error)
    gathered = Gathered(decode, len(eval_set), finished)
    queued = sentences_of(eval_set, decode, self.max_len, gathered.deliver, longest_first=False)
    for sentence in queued:
      sentence.on_error = failed
    self.in_flight(decode).put(queued)
    return queued

  def in_flight(self, decode: DecodeConfig | None = None) -> stream.Stream:
    """The in-flight slots of `decode`'s shape fed from other threads (made at first use)."""
    decoder_ = self.stream_decoder(decode)
    if id(decoder_) not in self._streams:
      self._streams[id(decoder_)] = stream.Stream(decoder_)
    return self._streams[id(decoder_)]

  def close(self):
    """Stops the in-flight slots' threads once what they hold is decoded."""
    for fed in self._streams.values():
      fed.close()
    self._streams.clear()

  def prepare_programs(self, narrowest: int = 0) -> int:
    """Prepares (compiles, or loads from the program store) every program of the default
    decoding's slots, each width class and the resizes between them, without decoding: what
    a server does before it opens its port (`narrowest` > 0: that many of the narrowest
    classes only, what short lines need). Returns how many programs."""
    return self.stream_decoder().programs(narrowest)

  def decoder(self, decode: DecodeConfig | None = None, every_option: bool = True,
              arrival_order: bool = False) -> scheduler.Decoder:
    """The slots that decode with `decode` (default: the engine's), made once per shape
    (`batches.decoder`: kind, beams, slots, width classes): requests that differ in runtime
    settings only share them; `every_option` False (a set decoded with its settings alone):
    the rules and sampling left out of their programs; `arrival_order`: the slots a stream
    feeds (a server's requests), with narrower width classes."""
    decode = decode or self.decode
    if not (decode.greedy or decode.sampling):  # (fewer beams are searched in wider slots)
      decode = dataclasses.replace(decode, beam_size=max(decode.beam_size,
                                                         self.decode.beam_size))
    key = (decode.greedy or decode.sampling, decode.beam_size, decode.beam_impl,
           slot_count(decode), draws(decode), every_option, arrival_order)
    if key not in self._decoders:
      self._decoders[key] = decoder(self.scorer, decode, self.mesh, every_option,
                                    arrival_order)
    return self._decoders[key]

  def set_decoder(self, decode: DecodeConfig | None = None) -> scheduler.Decoder:
    """The slots that decode a set with `decode` (default: the engine's) alone: validation,
    `evaluate`, `translate` (the rules and sampling in only if it asks for them)."""
    decode = decode or self.decode
    return self.decoder(decode, every_option=asks_options(decode))

  def stream_decoder(self, decode: DecodeConfig | None = None) -> scheduler.Decoder:
    """The slots a stream feeds (a server's requests, any options): every option in, the
    narrower width classes of arrival order."""
    return self.decoder(decode, arrival_order=True)

  def programs(self, width_class: int = 0, server: bool = False) -> dict:
    """The search's programs at a width class as this engine runs them (`Decoder.lowered`:
    "advance" and its loop-free twin "step"), each a function returning its
    `jax.stages.Lowered`: what the compile tool compiles for another platform; a set's
    (`set_decoder`), or with `server` a server's (`stream_decoder`)."""
    return (self.stream_decoder() if server else self.set_decoder()).lowered(width_class)

  def functions(self, width_class: int = 0, server: bool = False) -> tuple:
    """(the advance as a plain function, its abstract arguments) at a width class: what the
    CUDA export exports (`aot.cuda`); `server` as for `programs`."""
    decoder_ = self.stream_decoder() if server else self.set_decoder()
    return decoder_.advance.function, (self.scorer, *decoder_.abstract(width_class))
