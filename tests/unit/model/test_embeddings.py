"""Position encodings: the paper's sinusoids."""

import math

import pytest

from transformer_jax.model.embeddings import sinusoidal_positions


def test_sinusoidal_positions_match_the_paper_formula():
  table = sinusoidal_positions(10, 8)
  for pos in range(10):
    for i in range(4):
      angle = pos / 10000 ** (2 * i / 8)
      assert table[pos, 2 * i] == pytest.approx(math.sin(angle), abs=1e-6)
      assert table[pos, 2 * i + 1] == pytest.approx(math.cos(angle), abs=1e-6)
