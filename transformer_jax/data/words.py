"""Which whitespace-separated word of a text each of its subwords spells: SentencePiece's
offsets (the span of the text a piece was read from, or decodes to) mapped to the words
`text.split()` gives, whatever the normalisation, unknown pieces or spaces."""

from __future__ import annotations

from sentencepiece import sentencepiece_pb2


def parsed(serialized: bytes) -> sentencepiece_pb2.SentencePieceText:
  """SentencePiece's serialized output (`out_type="serialized_proto"`: pieces with offsets)."""
  return sentencepiece_pb2.SentencePieceText.FromString(serialized)


def char_spans(text: str, pieces) -> list[tuple[int, int]]:
  """The (begin, end) character offsets in `text` of pieces whose offsets SentencePiece gives
  in bytes of its UTF-8."""
  char_at = {}
  offset = 0
  for i, ch in enumerate(text):
    char_at[offset] = i
    offset += len(ch.encode())
  char_at[offset] = len(text)
  return [(char_at[p.begin], char_at[p.end]) for p in pieces]


def words_of_spans(text: str, spans: list[tuple[int, int]]) -> list[int]:
  """For each (begin, end) character span of `text`, the whitespace-separated word of `text`
  (counted from 0, as `text.split()` gives them) that it spells: the word of its first
  character that is not a space. A span of spaces alone (a word-start marker) belongs to the
  word after it, or at the end to the one before."""
  word_of_char, word, in_word = [], -1, False
  for ch in text:
    if ch.isspace():
      in_word = False
      word_of_char.append(-1)
    else:
      word += not in_word
      in_word = True
      word_of_char.append(word)
  words = [next((w for w in word_of_char[b:e] if w >= 0), None) for b, e in spans]
  following = None
  for i in reversed(range(len(words))):
    words[i] = following = words[i] if words[i] is not None else following
  preceding = 0
  for i, w in enumerate(words):
    words[i] = preceding = w if w is not None else preceding
  return words
