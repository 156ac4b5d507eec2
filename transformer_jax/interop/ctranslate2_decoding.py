"""A run's decoding settings (`config.decode`) as CTranslate2's `translate_batch` arguments,
with what CTranslate2 does differently said; and translating sentences with an exported
folder the way our `translate` does (SentencePiece pieces in and out, empty lines kept)."""

from __future__ import annotations

from transformer_jax.config.sections import DecodeConfig


def translate_options(decode: DecodeConfig, max_len: int) -> dict:
  """`translate_batch` keyword arguments closest to `decode` (max_len: the model's longest
  source, config.model.max_len)."""
  options = dict(max_input_length=max_len, max_decoding_length=min(decode.max_length, max_len),
                 min_decoding_length=decode.min_length)
  if decode.sampling:
    options.update(beam_size=1, sampling_topk=decode.top_k, sampling_topp=decode.top_p,
                   sampling_temperature=decode.temperature)
  elif decode.greedy:
    options.update(beam_size=1)
  else:
    options.update(beam_size=decode.beam_size, length_penalty=decode.length_penalty,
                   num_hypotheses=decode.nbest, return_scores=decode.nbest > 1)
  return options


def differences(decode: DecodeConfig) -> list[str]:
  """What CTranslate2 decodes differently from ours under `translate_options(decode)`."""
  notes = []
  if not (decode.greedy or decode.sampling) and decode.length_penalty:
    notes.append(f"length_penalty={decode.length_penalty}: ours divides a hypothesis' "
                 f"log-probability by ((5 + length) / 6) ** {decode.length_penalty} (GNMT), "
                 f"CTranslate2 by length ** {decode.length_penalty}")
  if decode.max_length_a or decode.max_length_b < decode.max_length:
    notes.append(f"max_length_a={decode.max_length_a}, max_length_b={decode.max_length_b}: "
                 "CTranslate2 caps a translation at max_decoding_length only, not at "
                 "a * source_length + b")
  if decode.mbr:
    notes.append(f"mbr={decode.mbr!r}: CTranslate2 has no minimum-Bayes-risk choice (take "
                 "num_hypotheses and choose among them yourself)")
  return notes


def translate(translator, sp, sentences: list[str], options: dict, source_tag: str = "",
              max_batch_size: int = 64) -> list[str]:
  """Translations of `sentences` (empty lines stay empty) with a `ctranslate2.Translator` and
  its SentencePiece processor `sp`; `source_tag`: a tagged run's tag before every source."""
  todo = [i for i, s in enumerate(sentences) if s.strip()]
  tokens = [([source_tag] if source_tag else []) + sp.encode(sentences[i], out_type=str)
            for i in todo]
  results = translator.translate_batch(tokens, max_batch_size=max_batch_size,
                                       batch_type="examples", **options)
  out = [""] * len(sentences)
  for i, result in zip(todo, results):
    out[i] = sp.decode(result.hypotheses[0])
  return out
