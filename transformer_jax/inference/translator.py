"""Translating text with a trained run: sentences in, (n-best) translations out, in order; input
batched by length, or line by line as it arrives."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import TextIO

from tqdm import tqdm

from transformer_jax.config.parse import replace_from_text
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.decoding.batches import translate_nbest
from transformer_jax.inference import trained_run

log = logging.getLogger(__name__)


class Translator:
  """A loaded model that turns lists of sentences into (n-best) translations."""

  def __init__(self, workdir: str, checkpoint: str = "latest", decode_overrides=()):
    self.run = trained_run.load(workdir)
    self.decode = replace_from_text(self.run.cfg.decode, list(decode_overrides), "decode")
    self.params = self.run.params(self.run.select_one(checkpoint, "translate"))

  def translate(self, sentences: list[str], progress: bool = False
                ) -> list[list[tuple[str, float]]]:
    """N-best (translation, score) lists, in input order; empty sentences give []."""
    results: list[list[tuple[str, float]]] = [[] for _ in sentences]
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    if not todo:
      return results
    eval_set = EvalSet.from_pairs([sentences[i] for i in todo], [], self.run.tokenizer)
    if max(len(x) for x in eval_set.source_ids) > self.run.cfg.model.max_len:
      log.warning("inputs longer than %d subwords are truncated", self.run.cfg.model.max_len)
    bar = None
    if progress:
      bar = tqdm(total=len(todo), unit="sent", file=sys.stderr)
    nbest = translate_nbest(self.run.model, self.params, eval_set, self.run.tokenizer,
                            self.decode, self.run.mesh,
                            on_batch=bar.update if bar is not None else None)
    if bar is not None:
      bar.close()
    for position, hyps in zip(todo, nbest):
      results[position] = hyps
    return results

  def output_lines(self, index: int, hyps: list[tuple[str, float]]) -> list[str]:
    """One line (nbest 1), or `nbest` lines `INDEX ||| translation ||| score`."""
    if self.decode.nbest == 1:
      return [hyps[0][0] if hyps else ""]
    if not hyps:  # (an empty input line keeps its index: one empty translation)
      return [f"{index} |||  ||| 0.0000"]
    return [f"{index} ||| {text} ||| {score:.4f}" for text, score in hyps]

  def translate_lines(self, lines: Iterable[str], out: TextIO, interactive: bool):
    """Writes the translation of each input line to `out`: all at once, batched by length
    (a progress bar from 200 lines on), or each line as soon as it is read."""
    if interactive:
      for index, line in enumerate(lines):
        for text in self.output_lines(index, self.translate([line])[0]):
          out.write(text + "\n")
        out.flush()
      return
    lines = list(lines)
    for index, hyps in enumerate(self.translate(lines, progress=len(lines) >= 200)):
      for text in self.output_lines(index, hyps):
        out.write(text + "\n")
