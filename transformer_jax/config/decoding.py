"""`config.decode`: how translations are searched for, each option declared once
(`config.fields.option`: its range, its request field, whether it compiles, its CTranslate2
equivalent, whether our search honours it), the functions that give CTranslate2's keywords
of the options that are a function of the section beside it."""

from __future__ import annotations

import dataclasses

from transformer_jax.config.fields import ByEngine, check_choices, check_ranges, option
from transformer_jax.errors import ConfigError


def _beam_search(decode) -> bool:
  return not (decode.greedy or decode.sampling)


# CTranslate2's `translate_batch` keywords of the options that are a function of the section
# (see fields.Option; each docstring is the reference page's entry).
def _ct2_beam_size(d):
  """`beam_size` in beam search"""
  return {"beam_size": d.beam_size} if _beam_search(d) else {}


def _ct2_length_penalty(d):
  """`length_penalty` in beam search (CTranslate2's formula), else 0 (scores: total
  log-probabilities, as ours)"""
  return {"length_penalty": d.length_penalty if _beam_search(d) else 0.0}


def _ct2_length_penalty_note(d) -> str:
  if not (_beam_search(d) and d.length_penalty):
    return ""
  return (f"length_penalty={d.length_penalty}: CTranslate2 divides a hypothesis' "
          f"log-probability by length ** {d.length_penalty}, ours by ((5 + length) / 6) ** "
          f"{d.length_penalty} (GNMT), and its beam stops once beam_size hypotheses have "
          "finished")


def _ct2_max_length(d):
  """`max_decoding_length`, at most (each sentence's own cap: max_length_a's row)"""
  return {"max_decoding_length": d.max_length}


def _ct2_caps_note(d) -> str:
  if not (d.max_length_a or d.max_length_b < d.max_length):
    return ""
  return (f"max_length_a={d.max_length_a}, max_length_b={d.max_length_b}: translate_batch caps "
          "a translation at max_decoding_length only, not at a * source_length + b (the "
          "engine gives each group of sentences of one cap a call of its own)")


_CAPS = ByEngine("each group of sentences of one cap (min(max_length, a * source length + b), "
                 "ours) translated with that `max_decoding_length`")


def _ct2_greedy(d):
  """`beam_size=1`, `sampling_topk=1`"""
  return {"beam_size": 1, "sampling_topk": 1} if d.greedy else {}


def _ct2_sampling(d):
  """`beam_size=1`"""
  return {"beam_size": 1} if d.sampling else {}


def _ct2_temperature(d):
  """`sampling_temperature` (sampling)"""
  return {"sampling_temperature": d.temperature} if d.sampling else {}


def _ct2_top_k(d):
  """`sampling_topk` (sampling; 0 = all, as ours)"""
  return {"sampling_topk": d.top_k} if d.sampling else {}


def _ct2_top_p(d):
  """`sampling_topp` (sampling)"""
  return {"sampling_topp": d.top_p} if d.sampling else {}


def _ct2_nbest(d):
  """`num_hypotheses` (without MBR)"""
  return {} if d.mbr else {"num_hypotheses": d.nbest}


def _ct2_mbr_candidates(d):
  """`num_hypotheses` (with MBR)"""
  return {"num_hypotheses": d.mbr_candidates} if d.mbr else {}


def _ct2_mbr_note(d) -> str:
  if not d.mbr:
    return ""
  return (f"mbr={d.mbr!r}: translate_batch has no minimum-Bayes-risk choice (the engine asks "
          "num_hypotheses=mbr_candidates and orders them by decoding.mbr.mbr_order)")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """How translations are searched for (`config.decode`), in training and in the tools."""
  # 1 with greedy=False is beam search of width 1 (== greedy)
  beam_size: int = option(minimum=1, request="beam_size", compiles="shape",
                          ctranslate2=_ct2_beam_size)
  # GNMT alpha; 0 ranks by total log-probability
  length_penalty: float = option(minimum=0, request="length_penalty", compiles="static",
                                 ctranslate2=_ct2_length_penalty,
                                 ctranslate2_note=_ct2_length_penalty_note)
  # most target tokens generated (EOS included)
  max_length: int = option(minimum=1, ctranslate2=_ct2_max_length)
  # a of the per-sentence limit a * source_length + b tokens
  max_length_a: float = option(ctranslate2=_CAPS, ctranslate2_note=_ct2_caps_note)
  # b of that limit
  max_length_b: int = option(ctranslate2=_CAPS)
  # sentences decoded together
  batch_size: int = option(minimum=1, compiles="shape", ctranslate2="max_batch_size")
  num_samples_to_log: int       # sample translations printed at each evaluation
  # argmax decoding, no beam
  greedy: bool = option(compiles="shape", ctranslate2=_ct2_greedy)
  # ancestral sampling instead of beam search
  sampling: bool = option(request="sampling", compiles="shape", ctranslate2=_ct2_sampling)
  # sampling: logits / temperature
  temperature: float = option(above=0, request="temperature", compiles="static",
                              ctranslate2=_ct2_temperature)
  # sampling: keep the k most likely tokens (0 = all)
  top_k: int = option(minimum=0, request="top_k", compiles="static", ctranslate2=_ct2_top_k)
  # sampling: keep the smallest set with probability >= p
  top_p: float = option(above=0, maximum=1, request="top_p", compiles="static",
                        ctranslate2=_ct2_top_p)
  # sampling: random seed (same seed, same samples)
  seed: int = option(ctranslate2=ByEngine(
      "`ctranslate2.set_random_seed` before sampling (once per process: a seed per call is "
      "refused)"))
  # beam search: hypotheses returned per sentence (<= beam_size)
  nbest: int = option(minimum=1, request="nbest", compiles="static", ctranslate2=_ct2_nbest)
  # beam search: fewest tokens before EOS may end a hypothesis
  min_length: int = option(minimum=0, compiles="static", ctranslate2="min_decoding_length")
  # beam search's self-attention caches: "gather" (a cache per hypothesis, reordered to its parent's
  # every step), "flat" (a sentence's hypotheses share one append-only cache, each reading its
  # ancestors' slots through a mask) or "auto" (flat: faster on a CPU and a GPU measured); same
  # outputs
  beam_impl: str = option(before="auto", choices=("auto", "gather", "flat"), compiles="shape",
                          ctranslate2=ByEngine("nothing to do: no output depends on it"))
  # sentences our search decodes at once, in flight (each in a slot of its own, sampling: each
  # sample); 0 = auto: 32 on a CPU (the fastest measured there: a few long sentences hold
  # fewer others at a wide cache), batch_size elsewhere
  slots: int = option(before=0, minimum=0, compiles="shape",
                      ctranslate2=ByEngine("nothing to do: it batches `max_batch_size`"))
  # minimum-Bayes-risk choice among candidates by a sacreBLEU utility: "chrf" or "bleu" (sentence
  # level); "" = off
  mbr: str = option(before="", choices=("", "chrf", "bleu"), compiles="static",
                    ctranslate2=ByEngine("its `num_hypotheses` candidates ordered by "
                                         "`decoding.mbr.mbr_order`, as ours"),
                    ctranslate2_note=_ct2_mbr_note)
  # mbr: candidates per sentence: the beam's n-best (<= beam_size) or, with sampling, that many
  # samples
  mbr_candidates: int = option(before=4, compiles="shape", ctranslate2=_ct2_mbr_candidates)
  # no n-gram of this many tokens twice in a translation (its forced prefix included): a token
  # that would repeat one is never chosen; 0 = off, at most 16 (each size compiles its programs)
  no_repeat_ngram_size: int = option(before=0, minimum=0, maximum=16,
                                     request="no_repeat_ngram_size",
                                     ctranslate2="no_repeat_ngram_size", compiles="static")
  # > 1: each token already in the translation has its logit divided by this (a negative
  # one multiplied) before the softmax (Keskar et al., 2019); 1 = off
  repetition_penalty: float = option(before=1.0, above=0, request="repetition_penalty",
                                     ctranslate2="repetition_penalty", compiles="static")

  def __post_init__(self):
    check_ranges("config.decode", self)
    check_choices("config.decode", self)
    if self.greedy and self.sampling:
      raise ConfigError("config.decode.greedy and config.decode.sampling are exclusive")
    if self.nbest > self.beam_size:
      raise ConfigError(f"config.decode.nbest={self.nbest} must be in [1, beam_size="
                        f"{self.beam_size}]")
    if self.nbest > 1 and (self.greedy or self.sampling):
      raise ConfigError("config.decode.nbest > 1 needs beam search (greedy/sampling are off)")
    if self.mbr and (self.greedy or not 2 <= self.mbr_candidates <= (
        10**6 if self.sampling else self.beam_size)):
      raise ConfigError(f"config.decode.mbr={self.mbr!r} needs 2 or more mbr_candidates (got "
                        f"{self.mbr_candidates}): the beam's n-best (<= beam_size="
                        f"{self.beam_size}) or samples (sampling=True); not greedy decoding")
    # A setting the mode would leave unused is a mistake, not a no-op (beam_size,
    # length_penalty, seed and beam_impl, in every config and read by their mode only, aside:
    # a request for sampling from a run set to flat beam search is not refused).
    unused = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if not self.sampling else {}
    unused.update({"min_length": 0} if self.greedy or self.sampling else {})
    for key, off in unused.items():
      if getattr(self, key) != off:
        mode = "sampling" if self.sampling else "greedy decoding" if self.greedy else "beam search"
        raise ConfigError(f"config.decode.{key}={getattr(self, key)} has no effect in {mode}; "
                          f"leave it at {off} or choose the mode that uses it")

  def length_limit(self, source_length: int) -> int:
    """The most tokens (EOS included) of the translation of a `source_length`-token source."""
    return max(1, min(self.max_length,
                      int(self.max_length_a * source_length + self.max_length_b)))
