"""Width classes: the few source widths sentences are padded to, and each one's cache length
(`Geometry`); which class holds a sentence, and which one the slots need as their outputs
grow. The slots (`scheduler.Decoder`) run at one class at a time, and move between
neighbouring classes (`slots.resized`): the programs are known from the config and the slot
settings, one advance per class and a resize between neighbours."""

from __future__ import annotations

import dataclasses
import math

# The narrowest width class. A set is queued longest first and passes each class once, each
# class an advance compiled: fewer, wider classes finish sooner at the same warm speed
# (test2016 in two classes instead of three). Slots fed in arrival order (a server's) run at
# the class of their widest sentence, and short ones are most: a narrower class keeps their
# steps cheaper (BENCHMARKS.md, "Decoding in flight").
SMALLEST_WIDTH = 24
ARRIVAL_ORDER_SMALLEST_WIDTH = 16
WIDTH_RATIO = 2  # each width class this many times the last
ROUNDING = 8  # cache lengths are multiples of this
HEADROOM = 8  # positions a cache keeps beyond the longest output in it when the slots narrow


def width_classes(max_width: int, ratio: float = WIDTH_RATIO,
                  smallest: int = SMALLEST_WIDTH) -> list[int]:
  """The source widths sentences are padded to: `smallest`, then each `ratio` times the last
  (rounded to 8), below `max_width` (the model's positions), which is the last."""
  widths, w = [], smallest
  while w < max_width:
    widths.append(w)
    w = max(_rounded(w * ratio), w + ROUNDING)
  return widths + [max_width]


def _rounded(n: float) -> int:
  return ROUNDING * math.ceil(n / ROUNDING)


@dataclasses.dataclass(frozen=True)
class Geometry:
  """What the programs are specialised to: the slots and their width classes, each a source
  width and a cache length (the positions its sentences usually need; a sentence that
  needs more moves the slots to a wider class: the last one's holds the longest cap)."""
  slots: int                      # N sentences at once
  arrivals: int                   # K sentences put into slots per program call
  widths: tuple[int, ...]         # the width classes
  capacities: tuple[int, ...]     # each class's cache length

  def class_of(self, length: int, prefix: int = 0) -> int:
    """The smallest class that holds a source of `length` ids and a forced prefix of
    `prefix` tokens (and its next one)."""
    for c, (w, capacity) in enumerate(zip(self.widths, self.capacities)):
      if length <= w and prefix < capacity:
        return c
    raise ValueError(f"a source of {length} ids fits no width class (widths {self.widths})")

  def class_for_step(self, step: int, current: int) -> int:
    """The smallest class whose cache holds position `step` (a smaller class than `current`
    only with HEADROOM positions to spare)."""
    for c, capacity in enumerate(self.capacities):
      if capacity > step + (HEADROOM if c < current else 0):
        return c
    return len(self.capacities) - 1


def geometry(slots: int, max_width: int, longest_cap: int, arrivals: int = 0,
             ratio: float = WIDTH_RATIO, smallest: int = SMALLEST_WIDTH) -> Geometry:
  """The width classes of sources up to `max_width`; a class of width w holds w + HEADROOM
  positions (a translation rarely outgrows its source by more), the last one `longest_cap`
  (no sentence's cap is longer)."""
  widths = width_classes(max_width, ratio, smallest)
  capacities = [min(_rounded(w + HEADROOM), longest_cap) for w in widths[:-1]] + [longest_cap]
  return Geometry(slots, arrivals or max(1, slots // 8), tuple(widths), tuple(capacities))
