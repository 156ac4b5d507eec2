"""What the server translates with: a trained run and our search (`Translator`), sentences
in, each one's n-best translations, scores and word alignments out, with the decoding options
a request may change."""

from __future__ import annotations

import dataclasses

from transformer_jax.config.parse import replace_from_text
from transformer_jax.inference.translator import Translator

# The decoding settings a request may choose (config.decode's keys).
REQUEST_OPTIONS = ("beam_size", "length_penalty", "nbest", "sampling", "temperature", "top_k",
                   "top_p")


@dataclasses.dataclass(frozen=True)
class Options:
  """A request's decoding options: overrides of config.decode (`REQUEST_OPTIONS`), sampling's
  seed and whether to align. Requests with equal options share batches."""
  decode: tuple = ()           # (key, value) pairs of REQUEST_OPTIONS
  seed: int | None = None
  alignments: bool = False


class JaxEngine:
  """A trained run decoded by our search; `dtype` as `translate --dtype`."""
  name = "jax"

  def __init__(self, workdir: list[str], checkpoint: str = "latest", dtype: str = "",
               source_tag: str = ""):
    self.translator = Translator(workdir, checkpoint, (), source_tag, dtype, alignments=True)
    cfg = self.translator.run.cfg
    self.source_lang, self.target_lang = cfg.data.source_lang, cfg.data.target_lang
    self.beam_size = self.translator.decode.beam_size

  def decode_config(self, options: Options):
    """config.decode with the request's options, checked as the config checks its own (a
    ConfigError naming the key)."""
    return replace_from_text(self.translator.decode,
                             [f"{k}={v}" for k, v in options.decode], "decode")

  def translate(self, sentences: list[str], prefixes: list[str], options: Options
                ) -> list[list[dict]]:
    """Each sentence's n-best: {"translation", "score"[, "alignment"]}, best first; an empty
    sentence has none."""
    results = self.translator.translate(sentences, prefixes=prefixes if any(prefixes) else None,
                                        seed=options.seed, decode=self.decode_config(options))
    out = [[{"translation": h.text, "score": float(h.score)} for h in hyps]
           for hyps in results]
    if options.alignments:
      flat = [(i, j) for i, hyps in enumerate(results) for j in range(len(hyps))]
      links = self.translator.alignments([sentences[i] for i, _ in flat],
                                         [results[i][j] for i, j in flat])
      for (i, j), link in zip(flat, links):
        out[i][j]["alignment"] = link
    return out

  def warm_up(self):
    self.translator.warm_up()
