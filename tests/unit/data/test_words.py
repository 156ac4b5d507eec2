"""Subwords mapped to the whitespace words of their text."""

from transformer_jax.data.words import char_spans, words_of_spans


class _Piece:
  def __init__(self, begin, end):
    self.begin, self.end = begin, end


def test_a_span_belongs_to_the_word_of_its_first_character_that_is_no_space():
  text = " Ein  Fahr rad\t."
  # (spans: " Ein", "  Fahr", "rad" after a space it does not hold, "", "\t.")
  assert words_of_spans(text, [(0, 4), (4, 10), (11, 14), (14, 14), (14, 16)]) == [0, 1, 2, 3, 3]
  assert words_of_spans("a b", [(1, 2), (2, 3)]) == [1, 1]  # (a space alone: the next word)
  assert words_of_spans("a ", [(0, 1), (1, 2)]) == [0, 0]   # (at the end: the one before)
  assert words_of_spans(text, []) == []


def test_byte_offsets_become_character_offsets():
  text = "Füße ﬁx"  # (ü, ß and ﬁ take 2, 2 and 3 bytes)
  assert char_spans(text, [_Piece(0, 6), _Piece(6, 7), _Piece(7, 10)]) == [(0, 4), (4, 5),
                                                                           (5, 6)]
