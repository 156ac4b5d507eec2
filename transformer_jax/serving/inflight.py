"""Requests straight into our engine's in-flight slots (`stream.Stream`): a request's
sentences join the queue as it arrives and go into the next free slots; nobody waits for a
batch to form, and each request is answered within a few steps (the stream's `max_steps`)
of its last sentence being done. Requests
with any decoding options share the slots (the options are each sentence's own), except
those that change a program's shape (sampling or greedy from a beam server, a wider beam),
which get slots of their own. The queue is bounded (`QueueFull`: the server answers 503), a
request whose client left is dropped from the queue (its sentences already in slots finish
unread), and `close()` stops taking requests and answers every one already taken. The same
interface as `batcher.Batcher`, which gathers CTranslate2's engine calls."""

from __future__ import annotations

import asyncio
import threading
import time

from transformer_jax.serving.batcher import Closed, QueueFull, _set
from transformer_jax.serving.metrics import Metrics
from transformer_jax.serving.service import Options


class InFlight:
  def __init__(self, service, metrics: Metrics, max_queue: int = 1024):
    self.service, self.metrics, self.max_queue = service, metrics, max_queue
    self.lock = threading.Lock()
    self.held = 0  # (sentences taken and not answered)
    self.closed = False
    self.idle = threading.Condition(self.lock)

  async def translate(self, sentences: list[str], prefixes: list[str], options: Options):
    """The engine's results for `sentences` (`Service.translate`'s)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()
    with self.lock:
      if self.closed:
        raise Closed()
      if self.held + len(sentences) > self.max_queue:
        raise QueueFull()
      self.held += len(sentences)
      self.metrics.queue_depth = self.held
    began = time.perf_counter()

    def done(result):
      with self.lock:
        self.held -= len(sentences)
        self.metrics.queue_depth = self.held
        self.idle.notify_all()
      if not isinstance(result, Exception):
        self.metrics.batch(len(sentences), time.perf_counter() - began)
      loop.call_soon_threadsafe(_set, future, None if isinstance(result, Exception) else result,
                                result if isinstance(result, Exception) else None)

    try:
      queued = self.service.submit(sentences, prefixes, options, done)
    except Exception:
      with self.lock:
        self.held -= len(sentences)
        self.metrics.queue_depth = self.held
      raise
    try:
      return await future
    except asyncio.CancelledError:  # (its deadline passed, or its client left)
      for sentence in queued:
        sentence.cancelled = True
      raise

  def close(self):
    """No more requests; those taken are answered before the engine's threads end."""
    with self.lock:
      self.closed = True
      while self.held:
        self.idle.wait(0.1)
    self.service.close()
