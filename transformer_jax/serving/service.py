"""What the server translates with: a `Translator` (our search, or CTranslate2's behind the
same interface), sentences in, each one's n-best translations, scores and word alignments out,
with the decoding options a request may change."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging

from transformer_jax.config import fields
from transformer_jax.config.sections import DecodeConfig
from transformer_jax.data.eval_sets import load_eval_set
from transformer_jax.data.plan import data_plan
from transformer_jax.errors import ConfigError, Error
from transformer_jax.inference.translator import Translator

log = logging.getLogger(__name__)

# The decoding settings a request may choose: {its field in `options`: config.decode's key},
# as their declarations say (config.fields.Option.request).
REQUEST_OPTIONS = {declared.request: key for key, declared in fields.options(DecodeConfig).items()
                   if declared.request}


@dataclasses.dataclass(frozen=True)
class Options:
  """A request's decoding options: overrides of config.decode (`REQUEST_OPTIONS`), sampling's
  seed and whether to align. Requests with equal options share batches."""
  decode: tuple = ()           # (config.decode's key, value) pairs, each of the key's type
  seed: int | None = None
  alignments: bool = False
  target: str = ""             # a multilingual run's target language ("": its only one)


@dataclasses.dataclass
class Translated:
  """A sentence as the server answers it: its n-best, and notes for the client (its source cut
  to the model's length, a translation stopped at its length cap) in the response's
  `warnings`."""
  hypotheses: list[dict]
  notes: list[str]


class Service:
  """A translator (over its engine, `decoding.engine`: "jax" or "ctranslate2") as the server
  uses it; made
  with batches of at most the server's size (`decode.batch_size`: few row counts compile).
  A model of target-language tags (`>>xx<<`: a multilingual run, an OPUS-MT import) served
  without --source_tag translates into each tag's language, the tag put before the source."""

  def __init__(self, translator: Translator):
    self.translator = translator
    self.name = translator.engine.name
    run = translator.run
    data, tokenizer = data_plan(run.cfg.data), run.tokenizer
    self.tags = {} if translator.source_prefix else {
        tag[2:-2]: tag for tag in tokenizer.language_tags}  # language -> its tag
    fixed = tokenizer.pieces(translator.source_prefix)  # (--source_tag's, if given)
    self.targets = (sorted(self.tags) or [t[2:-2] for t in fixed if t in tokenizer.language_tags]
                    or [data.cfg.target_lang])
    self.sources = sorted({data.cfg.source_lang, *(c.train.source_lang for c in data.corpora)})
    self.source_lang, self.target_lang = data.cfg.source_lang, self.targets[0]
    self.tokenizer = tokenizer
    self.beam_size = translator.decode.beam_size
    self.aligns = translator.alignment_layer is not None
    decode = translator.decode  # (n-best lists, the page's alternatives, need beam search)
    self.beam_search = not (decode.greedy or decode.sampling)
    self._aligning = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aligning")

  def decode_config(self, options: Options):
    """config.decode with the request's options, checked as the config checks its own and
    as the engine honours them (a ConfigError naming the key)."""
    if options.alignments and not self.aligns:
      raise ConfigError(f"alignments: not with the {self.name} engine (our search's: "
                        "--engine=jax)")
    if options.seed is not None and not self.translator.engine.seeds_each_call:
      raise ConfigError(f"seed: not with the {self.name} engine, which seeds its sampling "
                        "once per process (our search's: --engine=jax)")
    decode = dataclasses.replace(self.translator.decode, **dict(options.decode))
    self.translator.engine.check(decode)
    return decode

  def translate(self, sentences: list[str], prefixes: list[str], options: Options
                ) -> list[Translated]:
    """Each sentence's n-best ({"translation", "score"[, "alignment"]}, best first; none for
    an empty sentence) and what its client is told of it."""
    tag = self.tags.get(options.target, "")
    sentences = _tagged(sentences, tag)
    results = self.translator.translate(sentences, prefixes=prefixes if any(prefixes) else None,
                                        seed=options.seed, decode=self.decode_config(options))
    return self._answers(sentences, results, options, tag)

  def submit(self, sentences: list[str], prefixes: list[str], options: Options, done):
    """`translate` without waiting, through our engine's in-flight slots (`Engine.submit`):
    `done(list of Translated)`, or `done(error)`, is called from another thread once all
    are done (alignments, where asked, are made on a thread of their own, not the decoding
    one). Returns what a client that leaves may cancel."""
    tag = self.tags.get(options.target, "")
    sentences = _tagged(sentences, tag)
    decode = self.decode_config(options)
    self.translator.check_tagged([s for s in sentences if s.strip()])

    def finished(results):
      if isinstance(results, Exception):
        done(results)
      elif options.alignments:
        self._aligning.submit(self._answered, done, sentences, results, options, tag)
      else:
        self._answered(done, sentences, results, options, tag)
    return self.translator.engine.submit(sentences, prefixes if any(prefixes) else None,
                                         options.seed, decode, finished)

  def _answered(self, done, sentences, results, options: Options, tag: str):
    try:
      answers = self._answers(sentences, results, options, tag)
    except Exception as e:  # noqa: BLE001 (the client is told)
      done(e)
      return
    done(answers)

  def _answers(self, sentences, results, options: Options, tag: str) -> list[Translated]:
    out = [Translated([{"translation": h.text, "score": float(h.score)} for h in hyps],
                      self._notes(sentence, hyps))
           for sentence, hyps in zip(sentences, results)]
    if options.alignments:
      for answer, (_, links) in zip(out, self.translator.with_alignments(sentences, results)):
        for hyp, link in zip(answer.hypotheses, links):
          hyp["alignment"] = _untagged(link) if tag else link
    return out

  def _notes(self, sentence: str, hyps) -> list[str]:
    """What was not translated whole: a source past the model's positions (the search reads
    its first max_len subwords, as the tools do), translations its length cap stopped."""
    notes, limit = [], self.translator.max_len
    if sentence.strip():  # (the ids the search is given: --source_tag's, the text's, EOS)
      length = len(self.translator.source_prefix) + len(self.tokenizer.encode(sentence))
      if length > limit:
        notes.append(f"its {length} subwords are more than the model reads ({limit}): "
                     f"translated from the first {limit}")
    cut = [k for k, h in enumerate(hyps) if not h.ended]  # (each at its sentence's one cap)
    if cut:
      which = ("its translation" if len(hyps) == 1 else "hypothes" + (
          "is " if len(cut) == 1 else "es ") + ", ".join(str(k + 1) for k in cut)
          + f" of its {len(hyps)}")
      notes.append(f"{which} stopped at the length cap of {len(hyps[cut[0]].ids)} subwords, "
                   "unfinished")
    return notes

  def check_target(self, target: str):
    """A ConfigError naming the languages served, for a `target` that is not one of them."""
    if target not in self.targets:
      raise ConfigError(f"target language {target!r} is not served (this model: "
                        f"{'/'.join(self.sources)} -> {', '.join(self.targets)})")

  def warm_up(self, chunks: int = 3) -> int:
    """Makes ready the programs requests will need. Our engine decodes in flight: every
    program of its slots (each width class's and the resizes between them) is prepared,
    none is left to compile under load (`chunks`: 0 = only what a short line needs).
    CTranslate2: the run's validation sources translated in `chunks` batches of a few
    sizes, in file order (mixed lengths, as requests come); without the validation data on
    this machine, two short lines. Returns the programs (ours) or sentences (CTranslate2)."""
    run = self.translator.run
    if self.name == "jax":  # (the slots requests decode in: `SearchEngine.submit`'s)
      return self.translator.engine.prepare_programs(narrowest=0 if chunks else 2)
    if not chunks:
      self.translator.warm_up()
      return 2
    try:
      sources = load_eval_set(run.cfg.data, run.cfg.data.eval_split, run.tokenizer).sources
    except Error as e:
      log.warning("no validation data to warm up with (%s): the first requests of other "
                  "lengths may be slower", e)
      self.translator.warm_up()
      return 2
    done, sources = 0, _tagged(sources, self.tags.get(self.target_lang, ""))
    size = self.translator.decode.batch_size
    for rows in sorted({size, max(1, size // 4), 1}, reverse=True):
      for start in range(0, min(len(sources), chunks * rows), rows):
        done += len(self.translator.translate(sources[start:start + rows]))
    return done

  def close(self):
    """Stops the engine's threads once what they hold is answered."""
    self.translator.engine.close()
    self._aligning.shutdown()


def _tagged(sentences: list[str], tag: str) -> list[str]:
  """`sentences` with a target-language `tag` before each one that is not empty."""
  return [f"{tag} {s}" if tag and s.strip() else s for s in sentences]


def _untagged(links: str) -> str:
  """Pharaoh links of a source that began with a tag the server added, as word indices of
  the source the request sent (the tag, word 0, links to nothing)."""
  pairs = (link.split("-") for link in links.split())
  return " ".join(f"{int(i) - 1}-{j}" for i, j in pairs if int(i) > 0)
