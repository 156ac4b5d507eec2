"""Tokenizers: the joint SentencePiece model a run trains once on its training split (cached
and reused), or, for models imported from elsewhere (Marian/OPUS-MT), a source and a target
SentencePiece model over one shared vocabulary (`PairedTokenizer`).

Both are one file in a workdir (`spm.model`): a SentencePiece model, or a JSON bundle of the two
models and the vocabulary; `Tokenizer.load` and `Tokenizer.from_bytes` read either. Texts are
encoded and decoded as the `side` they are on ("source" or "target": the same for a joint
model; decoding's default is the target, what the model writes).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import json
import logging
import os
import random
import re
import threading
from collections.abc import Iterable
from pathlib import Path

import sentencepiece as spm

from transformer_jax import atomic
from transformer_jax.data.words import char_spans, parsed, words_of_spans
from transformer_jax.errors import ConfigError, DataError, TokenizerDamaged

log = logging.getLogger(__name__)

PAD_ID, EOS_ID, UNK_ID = 0, 1, 2  # PAD doubles as the decoder's start-of-sequence token.

# SentencePiece's sampler seeds each thread's generator from one process-wide seed, when the
# thread first samples: the seed is set and a new thread started under this lock.
_SAMPLING_SEED_LOCK = threading.Lock()
# The seed SentencePiece reads as "none given": it keeps the seed it had (taken as 0 here).
SPM_NO_SEED = 2**32 - 1

SIDES = ("source", "target")
PAIRED_FORMAT = "transformer_jax.paired_sentencepiece"  # the bundle's "format" field
# A target-language tag (OPUS-MT's convention, e.g. ">>fra<<"): a piece of its own that a
# source starts with to choose the language a multilingual model translates into.
LANGUAGE_TAG = re.compile(r">>[^\s<>]+<<")


def content_ids(ids) -> list[int]:
  """The ids before the first EOS, padding skipped: what a decoded sequence says."""
  out = []
  for i in ids:
    i = int(i)
    if i == EOS_ID:
      break
    if i != PAD_ID:
      out.append(i)
  return out


class Tokenizer:
  """A SentencePiece model with the id conventions the model and decoder rely on."""

  def __init__(self, model_proto: bytes, path: str = ""):
    self.path = path
    self.model_proto = model_proto
    try:
      self.sp = spm.SentencePieceProcessor(model_proto=model_proto)
    except RuntimeError as e:  # (a truncated or foreign file: sentencepiece names no file)
      raise TokenizerDamaged(
          f"tokenizer {path or '<bytes>'} is damaged or not a SentencePiece model "
          f"({str(e).splitlines()[0][:120]}); restore the file (its run's tokenizer.json "
          "records the fingerprint it must have) or, for a new run, delete it to train another"
      ) from None
    if (self.sp.pad_id(), self.sp.eos_id(), self.sp.unk_id()) != (PAD_ID, EOS_ID, UNK_ID):
      raise DataError(f"tokenizer {path or '<bytes>'} has pad/eos/unk ids "
                      f"{(self.sp.pad_id(), self.sp.eos_id(), self.sp.unk_id())}, "
                      f"expected {(PAD_ID, EOS_ID, UNK_ID)}")

  @property
  def fingerprint(self) -> str:
    """A hash of the model file: the same pieces and ids, the same fingerprint."""
    return hashlib.sha256(self.model_proto).hexdigest()[:16]

  @property
  def vocab_size(self) -> int:
    return self.sp.get_piece_size()

  def encode(self, text: str, side: str = "source") -> list[int]:
    """Subword ids of `text` (on `side`: the same for a joint model), followed by EOS; a
    language tag `text` starts with is its one piece (`leading_tag`)."""
    tag, rest = self._split_tag(text)
    return self._piece_ids(tag) + self._ids_of(rest, side) + [EOS_ID]

  def encode_batch(self, texts: list[str], side: str = "source") -> list[list[int]]:
    """`encode` of each text, on SentencePiece's threads (a model without tags)."""
    if self.language_tags:
      return [self.encode(text, side) for text in texts]
    return [ids + [EOS_ID] for ids in self._ids_of_batch(texts, side)]

  def encode_pieces(self, text: str, side: str = "source") -> list[str]:
    """The subword strings of `text`, without EOS (what CTranslate2 takes)."""
    tag, rest = self._split_tag(text)
    return tag + self._processor(side).encode(rest, out_type=str)

  def _split_tag(self, text: str) -> tuple[list[str], str]:
    """([the language tag `text` starts with], the rest): the tag is a piece of its own, as
    training put it before a tagged corpus's sources and Marian's tokenizer in transformers
    splits it, not what SentencePiece would cut the text into."""
    tag = self.leading_tag(text)
    return ([tag], text.lstrip()[len(tag):]) if tag else ([], text)

  def _processor(self, side: str) -> spm.SentencePieceProcessor:
    return self.sp

  def _ids_of(self, text: str, side: str, **sampling) -> list[int]:
    return self.sp.encode(text, **sampling)

  def _ids_of_batch(self, texts: list[str], side: str) -> list[list[int]]:
    return self.sp.encode(texts, num_threads=os.cpu_count() or 1)

  def piece_ids(self, pieces: list[str]) -> list[int]:
    """The ids of subword strings (what CTranslate2 returns)."""
    return self._piece_ids(pieces)

  def _piece_ids(self, pieces: list[str]) -> list[int]:
    return [self.sp.piece_to_id(piece) for piece in pieces]

  def sample_batch(self, texts: list[str], alpha: float, nbest_size: int,
                   seed: int, side: str = "source") -> list[list[int]]:
    """One sampled segmentation of each text (subword regularization: unigram models sample
    from the lattice, or its `nbest_size` best, by P^alpha; BPE models drop merges with
    probability alpha), EOS appended. The same texts and seed give the same ids: they are
    sampled in a thread of their own whose generator starts from `seed` (in [0, 2^32); the
    one value SentencePiece ignores, 2^32 - 1, as 0)."""
    out: list[list[int]] = []

    def sample():
      out.extend(self._sample(text, alpha, nbest_size, side) for text in texts)

    with _SAMPLING_SEED_LOCK:
      spm.set_random_generator_seed(seed % SPM_NO_SEED)
      thread = threading.Thread(target=sample, name="subword-sampling")
      thread.start()
      thread.join()
    if len(out) != len(texts):
      raise RuntimeError("SentencePiece sampling stopped short (see the error above)")
    return [ids + [EOS_ID] for ids in out]

  def _sample(self, text: str, alpha: float, nbest_size: int, side: str) -> list[int]:
    tag, rest = self._split_tag(text)
    return self._piece_ids(tag) + self._ids_of(rest, side, enable_sampling=True, alpha=alpha,
                                             nbest_size=nbest_size)

  def tag_id(self, tag: str, where: str) -> int:
    """The id of reserved token `tag` (a piece of its own); an error naming `where` (the
    config key that asks for it) when the tokenizer lacks it."""
    i = self.sp.piece_to_id(tag)
    if i == UNK_ID or self.sp.id_to_piece(i) != tag:
      raise DataError(f"{where}={tag!r}: tokenizer {self.path or '<bytes>'} has no piece "
                      f"{tag!r} (a tokenizer trained by this run reserves every tag; one "
                      "given by config.data.tokenizer_path must have been trained with it)")
    return i

  def detokenize(self, ids, side: str = "target") -> str:
    """Detokenized text of ids (on `side`), stopping at the first EOS and skipping padding."""
    return self.sp.decode(content_ids(ids))

  def pieces(self, ids) -> list[str]:
    """The subword strings of ids (for attention-map labels and debugging)."""
    return [self.sp.id_to_piece(int(i)) for i in ids]

  def encode_words(self, text: str, side: str = "source") -> tuple[list[int], list[int]]:
    """`encode(text)`'s ids without EOS, and for each the whitespace-separated word of `text`
    it spells (`words_of_spans`: by the span of `text` SentencePiece took it from, whatever
    normalisation or unknown pieces; a leading tag: its own word)."""
    tag, rest = self._split_tag(text)
    proto = parsed(self._processor(side).encode(rest, out_type="serialized_proto"))
    offset = len(text) - len(rest)  # (the tag and the spaces before it)
    spans = [(0, offset)] * len(tag) + [(b + offset, e + offset)
                                        for b, e in char_spans(rest, proto.pieces)]
    ids = self._piece_ids(tag + [p.piece for p in proto.pieces])
    return ids, words_of_spans(text, spans)

  def detokenize_words(self, ids, side: str = "target") -> tuple[str, list[int]]:
    """`detokenize(ids)`'s text, and for each of the ids it spells (those before EOS, padding
    skipped) the whitespace-separated word of that text it belongs to."""
    proto = parsed(self.sp.decode_ids(content_ids(ids), out_type="serialized_proto"))
    return proto.text, words_of_spans(proto.text, char_spans(proto.text, proto.pieces))

  @functools.cached_property
  def language_tags(self) -> tuple[str, ...]:
    """The vocabulary's target-language tags (`LANGUAGE_TAG`): a model with any translates
    into the language its source's tag names."""
    return tuple(p for p in self.pieces(range(self.vocab_size)) if LANGUAGE_TAG.fullmatch(p))

  def leading_tag(self, text: str) -> str:
    """The language tag `text` starts with, when the vocabulary has it; else ""."""
    match = LANGUAGE_TAG.match(text.lstrip())
    return match.group(0) if match and match.group(0) in self.language_tags else ""

  def sentencepiece_files(self) -> dict[str, bytes]:
    """The SentencePiece model(s) by the file names an exported model keeps them under."""
    return {"sentencepiece.model": self.model_proto}

  @staticmethod
  def from_bytes(data: bytes, path: str = "") -> "Tokenizer":
    """The tokenizer a file's bytes hold: a SentencePiece model, or a paired bundle."""
    if data[:1] == b"{":
      return PairedTokenizer(data, path)
    return Tokenizer(data, path)

  @staticmethod
  def load(path: str | Path) -> "Tokenizer":
    path = Path(path)
    if not path.is_file():
      raise DataError(f"tokenizer model {path} does not exist")
    return Tokenizer.from_bytes(path.read_bytes(), str(path))


class PairedTokenizer(Tokenizer):
  """A source and a target SentencePiece model whose pieces share one vocabulary (a list of
  pieces, by id): Marian's layout (OPUS-MT's source.spm, target.spm and vocab.json). A piece
  missing from the vocabulary is UNK, as in Marian. Ids 0, 1, 2 are PAD, EOS and UNK."""

  def __init__(self, data: bytes, path: str = ""):  # (not the joint model's __init__)
    self.path = path
    self.model_proto = data  # (the file's bytes: what the fingerprint and copies take)
    where = path or "<bytes>"
    try:
      bundle = json.loads(data)
      if bundle.get("format") != PAIRED_FORMAT:
        raise ValueError(f"format is not {PAIRED_FORMAT!r}")
      self.vocabulary = list(bundle["vocabulary"])
      self.sps = {side: spm.SentencePieceProcessor(
          model_proto=base64.b64decode(bundle[f"{side}_model"])) for side in SIDES}
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
      raise TokenizerDamaged(f"tokenizer {where} is damaged or not a paired SentencePiece "
                             f"bundle ({str(e).splitlines()[0][:120] if str(e) else e!r}); "
                             "restore the file (its run's tokenizer.json records its "
                             "fingerprint)") from None
    self.ids = {piece: i for i, piece in enumerate(self.vocabulary)}
    special = tuple(self.vocabulary[:3])
    if special != ("<pad>", "</s>", "<unk>"):
      raise DataError(f"tokenizer {where} has pieces {special} at ids 0, 1, 2, expected "
                      "('<pad>', '</s>', '<unk>')")
    # (no `sp`: a joint model's one processor; every method here names its side's)

  @staticmethod
  def bundle(source_model: bytes, target_model: bytes, vocabulary: list[str]) -> bytes:
    """The file holding two SentencePiece models and the vocabulary (pieces by id)."""
    return json.dumps({"format": PAIRED_FORMAT, "vocabulary": vocabulary,
                       "source_model": base64.b64encode(source_model).decode(),
                       "target_model": base64.b64encode(target_model).decode()}).encode()

  @property
  def vocab_size(self) -> int:
    return len(self.vocabulary)

  def _ids(self, pieces: list[str]) -> list[int]:
    return [self.ids.get(piece, UNK_ID) for piece in pieces]

  def _processor(self, side: str) -> spm.SentencePieceProcessor:
    return self.sps[side]

  def _ids_of(self, text: str, side: str, **sampling) -> list[int]:
    return self._ids(self.sps[side].encode(text, out_type=str, **sampling))

  def _ids_of_batch(self, texts: list[str], side: str) -> list[list[int]]:
    return [self._ids(p) for p in self.sps[side].encode(texts, out_type=str,
                                                        num_threads=os.cpu_count() or 1)]

  def _piece_ids(self, pieces: list[str]) -> list[int]:
    return self._ids(pieces)

  def tag_id(self, tag: str, where: str) -> int:
    if tag not in self.ids:
      raise DataError(f"{where}={tag!r}: tokenizer {self.path or '<bytes>'} has no piece "
                      f"{tag!r} in its vocabulary")
    return self.ids[tag]

  def detokenize(self, ids, side: str = "target") -> str:
    """`side`'s model's detokenization of the pieces up to the first EOS (PAD skipped)."""
    pieces = self.pieces(content_ids(ids))
    return self.sps[side].decode_pieces(pieces).replace("▁", " ").strip()

  def pieces(self, ids) -> list[str]:
    return [self.vocabulary[int(i)] for i in ids]

  def detokenize_words(self, ids, side: str = "target") -> tuple[str, list[int]]:
    proto = parsed(self.sps[side].decode_pieces(self.pieces(content_ids(ids)),
                                                 out_type="serialized_proto"))
    # (as `detokenize`: a piece unknown to the side's model keeps its '▁', read as a space; the
    # words are counted before the ends are stripped, which leaves them the same words)
    text = proto.text.replace("▁", " ")
    return text.strip(), words_of_spans(text, char_spans(proto.text, proto.pieces))

  def sentencepiece_files(self) -> dict[str, bytes]:
    """Marian's (and CTranslate2's Marian converter's) names."""
    return {f"{side}.spm": self.sps[side].serialized_model_proto() for side in SIDES}


def train_tokenizer(sentences: Iterable[str], vocab_size: int, path: str | Path,
                    max_sentences: int = 1_000_000, seed: int = 0, max_chars: int = 0,
                    tags: tuple[str, ...] = ()) -> Tokenizer:
  """Trains a joint unigram SentencePiece model on a sample of `sentences`; writes `path`.

  The sample (`training_sample`): up to `max_sentences` sentences drawn uniformly in one
  streaming pass, then, with `max_chars`, cut to that many characters — the usual character
  sample of a WMT-sized corpus (10M characters for a 32k vocabulary), whatever its size.
  """
  sample = training_sample(sentences, max_sentences, seed, max_chars)
  log.info("Training a %d-piece SentencePiece model on %d sentences (%d characters)",
           vocab_size, len(sample), sum(map(len, sample)))
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sample), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", character_coverage=1.0, pad_id=PAD_ID, eos_id=EOS_ID,
        unk_id=UNK_ID, bos_id=-1, num_threads=os.cpu_count() or 1,
        hard_vocab_limit=False, minloglevel=2,
        **({"user_defined_symbols": list(tags)} if tags else {}))
  except RuntimeError as e:
    if "smaller than required_chars" in str(e):  # "... 20 vs 92. Increase vocab_size ..."
      needed = str(e).split("required_chars.")[1].split(".")[0].strip()
      raise ConfigError(f"config.model.vocab_size={vocab_size} cannot hold the training "
                        f"data's characters and the special tokens ({needed}): raise it"
                        ) from None
    raise
  with atomic.replacing(path) as tmp:  # (a half-written model is never picked up)
    tmp.write_bytes(model.getvalue())
  return Tokenizer(model.getvalue(), str(path))


def load_or_train(path: str | Path, sentences_fn, vocab_size: int, max_sentences: int,
                  seed: int = 0, max_chars: int = 0, tags: tuple[str, ...] = ()) -> Tokenizer:
  """Loads the tokenizer at `path`, or trains it on `sentences_fn()` when it is not there yet."""
  if Path(path).is_file():
    return Tokenizer.load(path)
  return train_tokenizer(sentences_fn(), vocab_size, path, max_sentences, seed, max_chars, tags)


def training_sample(sentences: Iterable[str], max_sentences: int, seed: int = 0,
                    max_chars: int = 0) -> list[str]:
  """Up to `max_sentences` non-empty sentences sampled uniformly, then with `max_chars` only as
  many of them, in random order, as fit in that many characters (at least one)."""
  sample = _reservoir_sample(sentences, max_sentences, seed)
  if max_chars:
    random.Random(seed).shuffle(sample)
    total = 0
    for n, sentence in enumerate(sample):
      total += len(sentence)
      if total > max_chars:
        del sample[max(n, 1):]
        break
  return sample


def _reservoir_sample(items: Iterable[str], k: int, seed: int) -> list[str]:
  """Up to k items, uniformly sampled in one streaming pass (bounded memory on big corpora)."""
  rng = random.Random(seed)
  sample: list[str] = []
  for n, item in enumerate(items):
    if not item:
      continue
    if len(sample) < k:
      sample.append(item)
    else:
      j = rng.randint(0, n)
      if j < k:
        sample[j] = item
  return sample
