"""Translating text with a trained run: sentences in, (n-best) translations out, in order; input
batched by length, or line by line as it arrives."""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Iterable
from typing import TextIO

import numpy as np
from tqdm import tqdm

from transformer_jax.config.fields import check_honoured
from transformer_jax.config.parse import replace_from_text
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.data.tokenizer import EOS_ID, UNK_ID
from transformer_jax.decoding.batches import Hypothesis, translate_nbest
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.errors import DataError, UsageError
from transformer_jax.evaluation import alignment
from transformer_jax.inference import trained_run

log = logging.getLogger(__name__)


class Translator:
  """A loaded model (or an ensemble of several runs' models, one tokenizer) that turns lists
  of sentences into (n-best) translations, optionally each starting with a given prefix. The
  first run's decoding settings apply, with `decode_overrides`; `dtype`: the matmul dtype to
  decode in ("" = the run's)."""
  engine = "jax"  # (our search; interop.engines' CTranslate2 translator has this interface too)
  seeds_each_call = True  # (a call's `seed` decides its samples, whatever came before)

  def __init__(self, workdir: str | list[str], checkpoint: str = "latest",
               decode_overrides=(), source_tag: str = "", dtype: str = "",
               alignments: bool = False, alignment_layer: int | None = None):
    runs = trained_run.load_ensemble(workdir, dtype)
    self.run = runs[0]
    # (a tagged model's direction or data kind: the tag's id before every source)
    self.source_prefix = self.run.source_prefix(source_tag)
    self.decode = replace_from_text(self.run.cfg.decode, list(decode_overrides), "decode")
    self.check_honoured(self.decode)
    # (the longest source every member reads: the search cuts longer ones there)
    self.max_len = min(run.cfg.model.max_len for run in runs)
    selected = [run.select_one(checkpoint, "translate") for run in runs]
    # (as read: a damaged `latest` gives way to the newest checkpoint that restores)
    self.model, self.params, selected = trained_run.members(runs, selected)
    self.steps = [list(chosen.steps) for chosen in selected]  # (per run: the steps averaged)
    self.labels = [chosen.label for chosen in selected]
    self.scorer = prepare(self.model, self.params)  # (made ready once, for every call)
    # (word alignments: None = off, else the decoder layer whose cross-attention gives them)
    self.alignment_layer = None
    if alignments:
      layers = self.run.cfg.model.num_decoder_layers
      self.alignment_layer = (alignment.default_layer(layers) if alignment_layer is None
                              else alignment_layer)
      if not 0 <= self.alignment_layer < layers:
        raise UsageError(f"--alignment_layer={alignment_layer}: the decoder has layers 0 to "
                         f"{layers - 1}")

  def check_honoured(self, decode):
    """A ConfigError naming the first of `decode`'s options this engine cannot honour at its
    value (as the options' declarations say)."""
    check_honoured(decode, self.engine, "decode")

  def alignments(self, sentences: list[str], translations: list[Hypothesis]) -> list[str]:
    """Pharaoh word alignments (`evaluation.alignment`) of each translation to its sentence,
    from the cross-attention of layer `alignment_layer`."""
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
    """N-best lists (text, score, ids), in input order; empty sentences give []. With
    `prefixes` (line-aligned; "" = none) each translation starts with its prefix; `seed`:
    sampling's, instead of the decoding settings'; `decode`: settings instead of the
    translator's (a server's request)."""
    decode = decode or self.decode
    self.check_honoured(decode)
    results: list[list[Hypothesis]] = [[] for _ in sentences]
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    if not todo:
      return results
    self.check_tagged([sentences[i] for i in todo])
    eval_set = EvalSet.from_pairs([sentences[i] for i in todo], [], self.run.tokenizer,
                                  self.source_prefix)
    if prefixes is not None:
      eval_set = eval_set.with_prefixes([prefixes[i] for i in todo], self.run.tokenizer)
    if max(len(x) for x in eval_set.source_ids) > self.max_len:
      log.warning("inputs longer than %d subwords are truncated", self.max_len)
    bar = None
    if progress:
      bar = tqdm(total=len(todo), unit="sent", file=sys.stderr)
    decode = decode if seed is None else dataclasses.replace(decode, seed=seed)
    nbest = translate_nbest(self.scorer, None, eval_set, self.run.tokenizer,
                            decode, self.run.mesh,
                            on_batch=bar.update if bar is not None else None)
    if bar is not None:
      bar.close()
    for position, hyps in zip(todo, nbest):
      results[position] = hyps
    return results

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
    """Translates two made-up sources of 1 and 17 tokens (the two shortest length buckets),
    so that the programs a line typed interactively needs are traced, and compiled or loaded
    from the persistent compilation cache, while the answer to the first line is read."""
    ids = [np.asarray(self.source_prefix + [UNK_ID + 1] * n + [EOS_ID], np.int32)  # (a piece)
           for n in (1, 17)]
    for source in ids:
      translate_nbest(self.scorer, None, EvalSet([""], [""], [source], [source]),
                      self.run.tokenizer, self.decode, self.run.mesh)

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
