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
import functools
import logging
import sys
from typing import ClassVar

import jax
import numpy as np
from tqdm import tqdm

from transformer_jax.config.fields import check_honoured
from transformer_jax.config.sections import DecodeConfig
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.data.tokenizer import EOS_ID, UNK_ID, Tokenizer
from transformer_jax.decoding import search
from transformer_jax.decoding.batches import Hypothesis, search_settings, translate_nbest
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


class SearchEngine(Engine):
  """Our search (`decoding.search`) over a model made ready to decode (`ensemble.prepare`:
  one model or an ensemble), on `mesh` (None: one device)."""
  name = "jax"

  def __init__(self, scorer, tokenizer: Tokenizer, decode: DecodeConfig, mesh=None,
               source_prefix: tuple[int, ...] | list[int] = ()):
    self.scorer, self.tokenizer, self.decode, self.mesh = scorer, tokenizer, decode, mesh
    self.max_len = scorer.max_len
    self.source_prefix = tuple(source_prefix)

  def translate_set(self, eval_set, decode=None, on_batch=None):
    decode = decode or self.decode
    self.check(decode)
    return translate_nbest(self.scorer, eval_set, self.tokenizer, decode, self.mesh,
                           on_batch)

  def warm_up(self):
    """Translates two made-up sources of 1 and 17 tokens (the two shortest length buckets),
    so that the programs a line typed interactively needs are traced, and compiled or loaded
    from the program store, while the answer to the first line is read."""
    for n in (1, 17):
      source = np.asarray(list(self.source_prefix) + [UNK_ID + 1] * n + [EOS_ID], np.int32)
      self.translate_set(EvalSet([""], [""], [source], [source]))

  def _beam_settings(self) -> tuple[dict, dict]:
    """(the start's settings, the loop's and the step's) as this engine decodes."""
    settings = search_settings(self.decode)
    return ({k: settings[k] for k in ("beam_size", "beam_impl")},
            {k: settings[k] for k in ("alpha", "num_return", "min_len", "rules")})

  def beam_programs(self, inputs_BS, caps_B) -> dict:
    """The beam search's programs as this engine runs them, lowered for `inputs_BS` and
    `caps_B` (arrays or ShapeDtypeStructs, placed as the compile tool places them): "start"
    (the batch encoded, its caches made), "loop" (the compiled search loop at the cache's
    first length) and "step" (one step of it, the loop's loop-free twin), each a function
    returning its `jax.stages.Lowered`."""
    start_settings, loop_settings = self._beam_settings()

    def start():
      return search.beam_start.lower(self.scorer, inputs_BS, caps_B, None, **start_settings)
    state = functools.cache(lambda: start().compile().out_info)
    step = functools.partial(search.beam_step, **loop_settings)
    return {"start": start,
            "loop": lambda: search.beam_loop.lower(self.scorer, state(), **loop_settings,
                                                   stop_at=0),
            "step": lambda: jax.jit(step).lower(self.scorer, state())}

  def beam_functions(self) -> dict:
    """The beam search's start and loop as this engine runs them, as plain functions of
    (model, inputs, caps, prefixes) and (model, state), its settings bound (what the CUDA
    export exports: `aot.cuda`)."""
    start_settings, loop_settings = self._beam_settings()
    return {"start": functools.partial(search.beam_start.function, **start_settings),
            "loop": functools.partial(search.beam_loop.function, **loop_settings, stop_at=0)}
