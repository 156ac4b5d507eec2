"""A run's decoding settings (`config.decode`) as CTranslate2's `translate_batch` arguments, read
from the options' declarations, with what CTranslate2 does differently said (the engine that
decodes with them: `interop.engines.Ctranslate2Engine`)."""

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


def differences(decode: DecodeConfig, around_the_call: bool = False) -> list[str]:
  """What CTranslate2 decodes differently from ours under `translate_options(decode)` (each
  option's declared note); `around_the_call`: only what CTranslate2's engine, which honours
  the ByEngine options around the call, still does differently."""
  return [note for declared in fields.options(DecodeConfig).values() if declared.ctranslate2_note
          and not (around_the_call and isinstance(declared.ctranslate2, fields.ByEngine))
          for note in [declared.ctranslate2_note(decode)] if note]
