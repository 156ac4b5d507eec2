"""Device prefetch: the next batches are made and put on the devices in a thread while the
current step runs, with the data-iterator state of each batch kept for exact checkpoints."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from typing import Any

_DONE = object()


class DevicePrefetch:
  """Iterates `prepare(batch)` of `iterator`'s batches, `depth` batches ahead, in a thread.

  `get_state()` is the iterator's state after the last batch handed out (not after the ones
  read ahead), so a checkpoint taken after a step resumes at the next batch; `set_state`
  stops the thread and moves the iterator. Errors in the thread are raised by `__next__`.
  """

  def __init__(self, iterator, prepare: Callable[[Any], Any], depth: int = 1):
    self._it, self._prepare, self._depth = iterator, prepare, depth
    self._state = iterator.get_state()
    self._queue: queue.Queue | None = None
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None

  def _run(self, out: queue.Queue, stop: threading.Event):
    try:
      while not stop.is_set():
        batch = next(self._it)
        item = (self._prepare(batch), self._it.get_state())
        while not stop.is_set():
          try:
            out.put(item, timeout=0.1)
            break
          except queue.Full:
            continue
    except BaseException as e:  # noqa: BLE001 (handed to the consumer, raised there)
      out.put((_DONE, e))

  def __iter__(self):
    return self

  def __next__(self):
    if self._thread is None:
      self._stop = threading.Event()
      self._queue = queue.Queue(maxsize=self._depth)
      self._thread = threading.Thread(target=self._run, args=(self._queue, self._stop),
                                      daemon=True, name="device-prefetch")
      self._thread.start()
    item, state = self._queue.get()
    if item is _DONE:
      self._thread = None
      raise state
    self._state = state
    return item

  # The state in the form grain's checkpoint handler takes from iterators not its own: JSON
  # bytes, written as it writes its own iterators' states (the same files).
  def get_state(self) -> bytes:
    return json.dumps(self._state, indent=4).encode()

  def set_state(self, state: bytes):
    self.close()
    self._state = json.loads(state)
    self._it.set_state(self._state)

  def start_prefetch(self):
    """(Called by grain's checkpoint handler after a restore: the thread starts on use.)"""

  def close(self):
    """Stops the thread (the batches it read ahead are dropped; the state stays)."""
    if self._thread is not None:
      self._stop.set()
      self._thread.join()
      self._thread = None
      self._it.set_state(self._state)  # (back to the batch after the last one handed out)
