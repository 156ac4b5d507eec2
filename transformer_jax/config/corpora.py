"""The data sections nested in `config.data`: the training corpora of a mixture, the cleaning
rules applied when a local corpus is prepared, subword sampling. They have defaults (unlike the
sections), so configs written before they existed still load: no mixture, no cleaning, no
sampling.
"""

from __future__ import annotations

import dataclasses

from transformer_jax.config.checks import checked_kwargs
from transformer_jax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
  """One training corpus of a mixture (`config.data.corpora.NAME`). "" fields take the value of
  the same key in `config.data` (the main corpus)."""
  dataset: str = ""             # "local" or a TFDS name
  data_dir: str = ""            # the local folder ("" = config.data.data_dir)
  source_lang: str = ""         # the language of this corpus's sources: its pairs are the
                                # model's (source, target), whatever config.data's pair is
  target_lang: str = ""         # the language of this corpus's targets
  split: str = ""               # its training split
  weight: float = 1.0           # share of the pairs drawn (the weights are normalised)
  tag: str = ""                 # reserved token prepended to every source (e.g. "<BT>" or
                                # ">>fr<<"); "" = none
  eval_split: str = ""          # a split scored (loss, BLEU) at each validation; "" = none
  test_split: str = ""          # a split scored at the end of training and by evaluate

  def resolved(self, name: str, data) -> "CorpusConfig":
    """This corpus with its "" fields taken from `data` (a DataConfig), checked."""
    out = dataclasses.replace(
        self, dataset=self.dataset or data.dataset,
        data_dir=self.data_dir if self.data_dir or self.dataset not in ("", "local")
        else data.data_dir,
        source_lang=self.source_lang or data.source_lang,
        target_lang=self.target_lang or data.target_lang, split=self.split or data.train_split)
    if not self.weight > 0:
      raise ConfigError(f"config.data.corpora.{name}.weight={self.weight} must be positive")
    if out.source_lang == out.target_lang:
      raise ConfigError(f"config.data.corpora.{name}: source_lang and target_lang are both "
                        f"{out.source_lang!r}")
    if self.tag and (self.tag != self.tag.strip() or " " in self.tag):
      raise ConfigError(f"config.data.corpora.{name}.tag={self.tag!r} must be one token "
                        "without spaces")
    return out


@dataclasses.dataclass(frozen=True)
class CleaningConfig:
  """Rules dropping training pairs when a local corpus is prepared (`config.data.cleaning`);
  each pair is counted under the first rule it breaks, in this order; 0 / False = off."""
  empty: bool = False           # a side empty (or only spaces)
  max_words: int = 0            # a side of more than this many words (spaces split them)
  max_length_ratio: float = 0.0  # the longer side over this many times the shorter, in words
  identical: bool = False       # the source equal to the target (copied, untranslated)
  duplicates: bool = False      # a pair seen before (exact, both sides): the first one stays
  min_letter_fraction: float = 0.0  # a side whose non-space characters are less than this
                                # fraction letters (numbers, markup, symbols)
  examples: int = 3             # pairs shown (and kept in the report) per rule

  RULES = ("empty", "max_words", "max_length_ratio", "identical", "duplicates",
           "min_letter_fraction")

  def __post_init__(self):
    if self.max_words < 0 or self.examples < 0:
      raise ConfigError("config.data.cleaning.max_words and examples must be >= 0")
    if self.max_length_ratio and self.max_length_ratio < 1:
      raise ConfigError(f"config.data.cleaning.max_length_ratio={self.max_length_ratio} must "
                        "be >= 1 (or 0: off)")
    if not 0.0 <= self.min_letter_fraction <= 1.0:
      raise ConfigError(f"config.data.cleaning.min_letter_fraction={self.min_letter_fraction} "
                        "must be in [0, 1]")

  @property
  def active(self) -> dict:
    """The rules that are on, with their settings (what a prepared corpus depends on)."""
    return {rule: getattr(self, rule) for rule in self.RULES if getattr(self, rule)}


@dataclasses.dataclass(frozen=True)
class SubwordSamplingConfig:
  """Subword regularization (`config.data.subword_sampling`, Kudo 2018): each training pair
  segmented anew at every epoch by SentencePiece's sampling; validation, test and decoding keep
  the one best segmentation. alpha 0 = off (the pre-tokenized ids as stored)."""
  alpha: float = 0.0            # smoothing exponent: P(segmentation)^alpha; small = more varied
  nbest_size: int = -1          # sample from the n best segmentations; -1 = the whole lattice

  def __post_init__(self):
    if not 0.0 <= self.alpha <= 1.0:
      raise ConfigError(f"config.data.subword_sampling.alpha={self.alpha} must be in [0, 1] "
                        "(0: off)")
    if self.nbest_size < 2 and self.nbest_size != -1:
      raise ConfigError(f"config.data.subword_sampling.nbest_size={self.nbest_size} must be "
                        "-1 (the whole lattice) or >= 2")

  @property
  def active(self) -> bool:
    return self.alpha > 0


def parse_nested(cls, values, where: str):
  """`cls` from a dict of config values (each key a field of the right type)."""
  if isinstance(values, cls):
    return values
  if not isinstance(values, dict):
    raise ConfigError(f"{where} must be a section (ConfigDict), got {type(values).__name__}")
  return cls(**checked_kwargs(cls, values, f"{where}."))
