"""Width classes: a set's and a server's, their caches, which class holds a sentence and which
one the slots need as their outputs grow."""

from tests import helpers
from transformer_jax.decoding import batches, width_classes


class _TinyScorer:
  max_len = 256


def test_the_width_classes_and_the_caches_that_go_with_them():
  assert width_classes.width_classes(256) == [24, 48, 96, 192, 256]  # (a set's)
  assert width_classes.width_classes(256, smallest=16) == [16, 32, 64, 128, 256]
  assert width_classes.width_classes(100, smallest=16) == [16, 32, 64, 100]
  assert width_classes.width_classes(256, ratio=1.5, smallest=16) == [
      16, 24, 40, 64, 96, 144, 216, 256]
  assert width_classes.width_classes(10) == [10]
  assert batches.decoder(_TinyScorer(), helpers.section("decode")).geometry.widths[0] == 24
  assert batches.decoder(_TinyScorer(), helpers.section("decode"),
                         arrival_order=True).geometry.widths[0] == 16
  g = width_classes.geometry(128, 256, 200, smallest=16)
  assert g.capacities == (24, 40, 72, 136, 200) and g.arrivals == 16
  assert g.class_of(16) == 0 and g.class_of(17) == 1 and g.class_of(3, prefix=30) == 1
  # (wider for a longer output at once; narrower only with HEADROOM positions to spare)
  assert g.class_for_step(23, current=0) == 0 and g.class_for_step(24, current=0) == 1
  assert g.class_for_step(16, current=1) == 1 and g.class_for_step(15, current=1) == 0
  assert g.class_for_step(500, current=0) == 4
