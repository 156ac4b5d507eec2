"""Translating text with a trained run through a decoding engine: sentences in, (n-best)
translations out, in order; input batched by length, or line by line as it arrives."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import TextIO

from transformer_jax.config.parse import replace_from_text
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.decoding.batches import Hypothesis
from transformer_jax.decoding.engine import Engine, SearchEngine
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.errors import DataError, UsageError
from transformer_jax.evaluation import alignment
from transformer_jax.inference import trained_run

log = logging.getLogger(__name__)


class Translator:
  """A decoding tool's translator: a decoding engine (`decoding.engine`) over a trained run,
  lines in and their (n-best) translations out in the tools' formats, word alignments where
  the engine is our search. Made from workdirs it is our search over one run's model or an
  ensemble of several runs' models (one tokenizer): the first run's decoding settings apply,
  with `decode_overrides`; `dtype`: the matmul dtype to decode in ("" = the run's). Another
  engine over a run: `Translator.over`."""

  def __init__(self, workdir: str | list[str], checkpoint: str = "latest",
               decode_overrides=(), source_tag: str = "", dtype: str = "",
               alignments: bool = False, alignment_layer: int | None = None):
    runs = trained_run.load_ensemble(workdir, dtype)
    run = runs[0]
    decode = replace_from_text(run.cfg.decode, list(decode_overrides), "decode")
    selected = [r.select_one(checkpoint, "translate") for r in runs]
    # (as read: a damaged `latest` gives way to the newest checkpoint that restores)
    self.model, self.params, selected = trained_run.ensemble_models(runs, selected)
    # (made ready once, for every call; the longest source every model reads)
    engine = SearchEngine(prepare(self.model, self.params), run.tokenizer, decode, run.mesh,
                          run.source_prefix(source_tag))
    engine.check(decode)
    self._hold(engine, run, selected)
    if alignments:
      layers = run.cfg.model.num_decoder_layers
      self.alignment_layer = (alignment.default_layer(layers) if alignment_layer is None
                              else alignment_layer)
      if not 0 <= self.alignment_layer < layers:
        raise UsageError(f"--alignment_layer={alignment_layer}: the decoder has layers 0 to "
                         f"{layers - 1}")

  @classmethod
  def over(cls, engine: Engine, run, selected) -> Translator:
    """A translator of `engine` decoding `run`'s `selected` checkpoint (no alignments)."""
    translator = cls.__new__(cls)
    translator._hold(engine, run, [selected])
    return translator

  def _hold(self, engine: Engine, run, selected: list):
    self.engine, self.run = engine, run
    self.steps = [list(chosen.steps) for chosen in selected]  # (per run: the steps averaged)
    self.labels = [chosen.label for chosen in selected]
    # (word alignments: None = off, else the decoder layer whose cross-attention gives them)
    self.alignment_layer = None

  @property
  def decode(self):
    return self.engine.decode

  @property
  def max_len(self) -> int:
    """The longest source the engine reads (an ensemble's shortest reach)."""
    return self.engine.max_len

  @property
  def source_prefix(self) -> list[int]:
    """The ids before every source (a tag's: a tagged model's direction or data kind)."""
    return list(self.engine.source_prefix)

  def alignments(self, sentences: list[str], translations: list[Hypothesis]) -> list[str]:
    """Pharaoh word alignments (`evaluation.alignment`) of each translation to its sentence,
    from the cross-attention of layer `alignment_layer`."""
    if self.alignment_layer is None:
      raise UsageError(f"alignments: not with the {self.engine.name} engine (our search's, "
                       "with --alignments)")
    todo = [i for i, (s, t) in enumerate(zip(sentences, translations)) if s.strip() and t.ids]
    out = [""] * len(sentences)
    if not todo:
      return out
    eval_set = EvalSet.from_pairs([sentences[i] for i in todo], [], self.run.tokenizer,
                                  self.source_prefix)
    lines = alignment.align(self.model, self.params, self.run.tokenizer, eval_set,
                            [translations[i].ids for i in todo], self.alignment_layer)
    for i, line in zip(todo, lines):
      out[i] = line
    return out

  def translate(self, sentences: list[str], progress: bool = False,
                prefixes: list[str] | None = None, seed: int | None = None, decode=None
                ) -> list[list[Hypothesis]]:
    """The engine's n-best lists (`Engine.translate`), in input order, after checking that a
    model that needs a target-language tag has one on each sentence."""
    self.check_tagged([s for s in sentences if s.strip()])
    return self.engine.translate(sentences, prefixes, seed, decode, progress)

  def check_tagged(self, sentences: list[str]):
    """An error naming the first of `sentences` without a target-language tag, when the
    model needs one (`TrainedRun.untagged`) and no --source_tag gives it."""
    tokenizer = self.run.tokenizer
    if tokenizer.language_tags and not self.source_prefix:
      untagged = next((s for s in sentences if not tokenizer.leading_tag(s)), None)
      if untagged is not None:
        line = untagged.strip()
        raise self.run.untagged(f"the line {line[:40] + '...' * (len(line) > 40)!r}")

  def warm_up(self):
    """The engine's warm-up (`Engine.warm_up`): what a line typed interactively needs is
    prepared while the answer to the first line is read."""
    self.engine.warm_up()

  def output_lines(self, index: int, hyps: list[Hypothesis],
                   aligned: list[str] | None = None) -> list[str]:
    """One line (nbest 1), or `nbest` lines `INDEX ||| translation ||| score`, an empty input
    line's too (empty translations: every sentence has as many lines, so a reader may count
    them); with alignments (`aligned`, one per hypothesis), ` ||| ALIGNMENT` after each
    (Marian's layout)."""
    if self.decode.nbest == 1:
      lines = [hyps[0].text if hyps else ""]
    elif not hyps:
      lines = [f"{index} |||  ||| 0.0000"] * self.decode.nbest
    else:
      lines = [f"{index} ||| {h.text} ||| {h.score:.4f}" for h in hyps]
    if aligned is None:
      return lines
    return [f"{line} ||| {links}" for line, links in zip(lines, aligned or [""] * len(lines))]

  def with_alignments(self, lines: list[str], results):
    """(hypotheses, their alignments or None) for each line."""
    if self.alignment_layer is None:
      return [(hyps, None) for hyps in results]
    flat = [(i, h) for i, hyps in enumerate(results) for h in hyps]
    aligned = self.alignments([lines[i] for i, _ in flat], [h for _, h in flat])
    per_line = [[] for _ in results]
    for (i, _), links in zip(flat, aligned):
      per_line[i].append(links)
    return list(zip(results, per_line))

  def translate_lines(self, lines: Iterable[str], out: TextIO, interactive: bool,
                      prefixes: list[str] | None = None):
    """Writes the translation of each input line to `out`: all at once, batched by length
    (a progress bar from 200 lines on), or each line as soon as it is read. `prefixes`:
    target prefixes, line-aligned with `lines` (not with `interactive`)."""
    if interactive and prefixes is not None:
      raise UsageError("--prefix_file needs the whole input at once: not with --interactive")
    if interactive:  # (the first line prepares its own programs; the rest wait for none)
      print("ready: one sentence per line (Ctrl-D ends)", file=sys.stderr, flush=True)
      for index, line in enumerate(lines):
        ((hyps, aligned),) = self.with_alignments([line], self.translate([line]))
        for text in self.output_lines(index, hyps, aligned):
          out.write(text + "\n")
        out.flush()
        if index == 0 and sys.stdin.isatty():  # (while a person reads the first answer)
          self.warm_up()
      return
    lines = list(lines)
    if prefixes is not None and len(prefixes) != len(lines):
      raise DataError(f"--prefix_file has {len(prefixes)} lines, the input {len(lines)}: "
                      "one prefix line per input line (empty for none)")
    results = self.translate(lines, progress=len(lines) >= 200, prefixes=prefixes)
    for index, (hyps, aligned) in enumerate(self.with_alignments(lines, results)):
      for text in self.output_lines(index, hyps, aligned):
        out.write(text + "\n")
