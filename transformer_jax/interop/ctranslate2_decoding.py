"""A run's decoding settings (`config.decode`) as CTranslate2's `translate_batch` arguments,
with what CTranslate2 does differently said; and translating sentences with an exported
folder the way our `translate` does (SentencePiece pieces in and out, empty lines kept)."""

from __future__ import annotations

from transformer_jax.config import fields
from transformer_jax.config.sections import DecodeConfig


def translate_options(decode: DecodeConfig, max_len: int) -> dict:
  """`translate_batch` keyword arguments of `decode`, as each option's declaration maps it
  (config.fields.Option.ctranslate2; max_len: the model's longest source,
  config.model.max_len; scores always returned). What the engine does around the call
  (each sentence's cap, MBR) is not in them: `differences` names it."""
  out = dict(max_input_length=max_len, return_scores=True)
  for name, declared in fields.options(DecodeConfig).items():
    equivalent = declared.ctranslate2
    if isinstance(equivalent, str):
      given = {equivalent: getattr(decode, name)}
    elif equivalent is None or isinstance(equivalent, fields.ByEngine):
      continue
    else:
      given = equivalent(decode)
    for key, value in given.items():
      if out.setdefault(key, value) != value:
        raise ValueError(f"{name} maps {key}={value!r}, another option {out[key]!r}")
  out["max_decoding_length"] = min(out["max_decoding_length"], max_len)
  return out


def differences(decode: DecodeConfig, engine: bool = False) -> list[str]:
  """What CTranslate2 decodes differently from ours under `translate_options(decode)` (each
  option's declared note); `engine`: only what the engine, which honours the ByEngine
  options around the call, still does differently."""
  return [note for declared in fields.options(DecodeConfig).values() if declared.ctranslate2_note
          and not (engine and isinstance(declared.ctranslate2, fields.ByEngine))
          for note in [declared.ctranslate2_note(decode)] if note]


def translate(translator, sp, sentences: list[str], options: dict, source_tag: str = "",
              max_batch_size: int = 64) -> list[str]:
  """Translations of `sentences` (empty lines stay empty) with a `ctranslate2.Translator` and
  its SentencePiece processor `sp`; `source_tag`: a tagged run's tag before every source;
  `max_batch_size` unless `options` has one."""
  todo = [i for i, s in enumerate(sentences) if s.strip()]
  tokens = [([source_tag] if source_tag else []) + sp.encode(sentences[i], out_type=str)
            for i in todo]
  results = translator.translate_batch(tokens, **{"max_batch_size": max_batch_size,
                                                  "batch_type": "examples", **options})
  out = [""] * len(sentences)
  for i, result in zip(todo, results):
    out[i] = sp.decode(result.hypotheses[0])
  return out
