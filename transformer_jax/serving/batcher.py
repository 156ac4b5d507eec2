"""Dynamic micro-batching: concurrent requests' sentences gathered into one engine call (up
to `max_sentences`; a batch waits up to `max_wait_s` for as many as the last one answered and
left waiting: `_next_batch`), in a thread of its own so that the event loop keeps accepting.
Requests with different decoding options never share a batch, and a request with a sampling
seed has one of its own (its samples then depend on nothing else). The queue is bounded
(`QueueFull`: the server answers 503), and `close()` stops taking requests and answers every
one already taken."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time

from transformer_jax.serving.engine import Options
from transformer_jax.serving.metrics import Metrics

log = logging.getLogger(__name__)


class QueueFull(Exception):
  """More sentences wait than the queue holds."""


class Closed(Exception):
  """The server is shutting down."""


@dataclasses.dataclass
class _Job:
  sentences: list[str]
  prefixes: list[str]
  options: Options
  future: asyncio.Future
  loop: asyncio.AbstractEventLoop
  arrived: float


class Batcher:
  def __init__(self, engine, metrics: Metrics, max_sentences: int = 32,
               max_wait_s: float = 0.01, max_queue: int = 1024):
    self.engine, self.metrics = engine, metrics
    self.max_sentences, self.max_wait_s, self.max_queue = max_sentences, max_wait_s, max_queue
    self.jobs: list[_Job] = []
    self.cond = threading.Condition()
    self.closed = False
    self.answered = 0.0  # (when the engine last answered: time.monotonic())
    self.expected = 0    # (the sentences it answered and those waiting then)
    self.thread = threading.Thread(target=self._run, name="batcher", daemon=True)
    self.thread.start()

  def _waiting(self) -> int:
    return sum(len(j.sentences) for j in self.jobs)

  async def translate(self, sentences: list[str], prefixes: list[str], options: Options):
    """The engine's results for `sentences`, batched with other requests'."""
    loop = asyncio.get_running_loop()
    job = _Job(sentences, prefixes, options, loop.create_future(), loop, time.monotonic())
    with self.cond:
      if self.closed:
        raise Closed()
      if self._waiting() + len(sentences) > self.max_queue:
        raise QueueFull()
      self.jobs.append(job)
      self.metrics.queue_depth = self._waiting()
      self.cond.notify()
    try:
      return await job.future
    except asyncio.CancelledError:  # (its deadline passed: not translated if still waiting)
      with self.cond:
        if job in self.jobs:
          self.jobs.remove(job)
          self.metrics.queue_depth = self._waiting()
      raise

  def close(self):
    """No more requests; those taken are answered before the thread ends."""
    with self.cond:
      self.closed = True
      self.cond.notify()
    self.thread.join()

  def _next_batch(self) -> list[_Job] | None:
    """Jobs for one engine call (those with the first job's options, up to max_sentences
    sentences; a larger request alone), or None once closed and drained."""
    with self.cond:
      while True:
        while not self.jobs:
          if self.closed:
            return None
          self.cond.wait()
        self._wait_for_more()
        if self.jobs:  # (unless the waiting requests' deadlines passed meanwhile)
          break
      first, batch, size = self.jobs[0], [], 0
      for job in list(self.jobs):
        if batch and first.options.seed is not None:
          break  # (a seeded request alone: its samples' keys fold in its own sentence indices)
        if job.options == first.options and (not batch or size + len(job.sentences)
                                             <= self.max_sentences):
          batch.append(job)
          size += len(job.sentences)
          self.jobs.remove(job)
      self.metrics.queue_depth = self._waiting()
      return batch

  def _wait_for_more(self):
    """Waits (holding the condition) for the sentences the last batch answered (their
    clients are likely to send again) and those that queued while it ran, at most max_wait
    from the later of the first request and the engine's last answer: otherwise, under a
    steady load, each batch would leave with only those that queued while the last one ran,
    and two halves of the clients would alternate in half-size batches. A lone client, a
    request after a pause and a seeded request (batched alone) wait for nobody."""
    first = self.jobs[0]
    idle = first.arrived - self.answered > self.max_wait_s
    wanted = (len(first.sentences) if idle or first.options.seed is not None
              else min(self.max_sentences, max(1, self.expected)))
    deadline = max(first.arrived, self.answered) + self.max_wait_s
    while (not self.closed and self.jobs and self._same(self.jobs[0]) < wanted
           and time.monotonic() < deadline):
      self.cond.wait(max(0.0, deadline - time.monotonic()))

  def _same(self, first: _Job) -> int:
    return sum(len(j.sentences) for j in self.jobs if j.options == first.options)

  def _run(self):
    while (batch := self._next_batch()) is not None:
      sentences = [s for job in batch for s in job.sentences]
      prefixes = [p for job in batch for p in job.prefixes]
      began = time.perf_counter()
      try:
        results = self.engine.translate(sentences, prefixes, batch[0].options)
      except Exception as e:  # (answered to each request of the batch, the server goes on)
        log.exception("batch of %d sentences failed", len(sentences))
        for job in batch:
          job.loop.call_soon_threadsafe(_set, job.future, None, e)
        continue
      self.metrics.batch(len(sentences), time.perf_counter() - began)
      with self.cond:
        self.answered, self.expected = time.monotonic(), len(sentences) + self._waiting()
      start = 0
      for job in batch:
        mine = results[start:start + len(job.sentences)]
        start += len(job.sentences)
        job.loop.call_soon_threadsafe(_set, job.future, mine, None)


def _set(future: asyncio.Future, result, error):
  if future.done():  # (its client left)
    return
  if error is not None:
    future.set_exception(error)
  else:
    future.set_result(result)
