"""Dynamic micro-batching: concurrent requests' sentences gathered into engine calls, run by
`workers` threads of their own so that the event loop keeps accepting. Each worker takes its
share of the sentences the server holds (up to `max_sentences`), waiting up to `max_wait_s`
for its share of those held at the engine's last answer (`_next_batch`). Two batches at once
use a CPU's cores better than one batch of both: a small batch's operations are too small to
split between cores, while two programs each keep one busy. Requests with different decoding
options (a sampling seed among them) never share a batch; a sample depends on its seed and
its own sentence only, whatever else its batch holds. A batch whose engine call fails is
translated again request by request, so that only the request that broke it fails. The queue
is bounded (`QueueFull`: the server answers 503), and `close()` stops taking requests and
answers every one already taken."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time

from transformer_jax.serving.metrics import Metrics
from transformer_jax.serving.service import Options

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
  def __init__(self, service, metrics: Metrics, max_sentences: int = 32,
               max_wait_s: float = 0.01, max_queue: int = 1024, workers: int = 1):
    self.service, self.metrics = service, metrics
    self.max_sentences, self.max_wait_s, self.max_queue = max_sentences, max_wait_s, max_queue
    self.workers = workers
    self.jobs: list[_Job] = []
    self.cond = threading.Condition()
    self.gathering = threading.Lock()  # (one worker at a time gathers its batch)
    self.closed = False
    self.running = 0     # (sentences in the engine now, all workers' batches)
    self.answered = 0.0  # (when the engine last answered: time.monotonic())
    self.expected = 0    # (the sentences held then: answered, running and waiting)
    self.threads = [threading.Thread(target=self._run, name=f"batcher-{i}", daemon=True)
                    for i in range(workers)]
    for thread in self.threads:
      thread.start()

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
    """No more requests; those taken are answered before the workers end."""
    with self.cond:
      self.closed = True
      self.cond.notify_all()
    for thread in self.threads:
      thread.join()

  def _share(self, held: int) -> int:
    """A worker's batch size when the server holds `held` sentences (running and waiting)."""
    return min(self.max_sentences, max(1, -(-held // self.workers)))

  def _next_batch(self) -> list[_Job] | None:
    """Jobs for one engine call (those with the first job's options, up to a worker's share
    of the sentences held; a larger request alone), or None once closed and drained."""
    with self.gathering, self.cond:
      while True:
        while not self.jobs:
          if self.closed:
            return None
          self.cond.wait()
        self._wait_for_more()
        if self.jobs:  # (unless the waiting requests' deadlines passed meanwhile)
          break
      first, batch, size = self.jobs[0], [], 0
      share = self._share(self.running + self._same(first))
      for job in list(self.jobs):
        if job.options == first.options and (not batch or size + len(job.sentences) <= share):
          batch.append(job)
          size += len(job.sentences)
          self.jobs.remove(job)
      self.running += size
      self.metrics.queue_depth = self._waiting()
      return batch

  def _wait_for_more(self):
    """Waits (holding the condition) for this worker's share of the sentences held at the
    engine's last answer (that batch's clients are likely to send again), at most max_wait
    from the later of the first request and that answer: otherwise, under a steady load, each
    batch would leave with only those that queued while the last one ran, and two halves of
    the clients would alternate in half-size batches. A lone client, a request after a pause
    and a seeded request (its seed an option few others share) wait for nobody."""
    first = self.jobs[0]
    idle = first.arrived - self.answered > self.max_wait_s
    wanted = (len(first.sentences) if idle or first.options.seed is not None
              else self._share(self.expected))
    deadline = max(first.arrived, self.answered) + self.max_wait_s
    while (not self.closed and self.jobs and self._same(self.jobs[0]) < wanted
           and time.monotonic() < deadline):
      self.cond.wait(max(0.0, deadline - time.monotonic()))

  def _same(self, first: _Job) -> int:
    return sum(len(j.sentences) for j in self.jobs if j.options == first.options)

  def _run(self):
    while (batch := self._next_batch()) is not None:
      size = sum(len(job.sentences) for job in batch)
      self._answer(batch)
      with self.cond:
        self.running -= size
        self.answered = time.monotonic()
        self.expected = size + self.running + self._waiting()

  def _answer(self, batch: list[_Job]):
    """Translates the jobs' sentences in one engine call and answers each job its own. A call
    that fails is tried again for each job alone, so that the request that broke it (a text
    the tokenizer refuses, say) gets the error and the others their translations."""
    sentences = [s for job in batch for s in job.sentences]
    began = time.perf_counter()
    try:
      results = self.service.translate(sentences, [p for job in batch for p in job.prefixes],
                                      batch[0].options)
    except Exception as e:  # (the server goes on; the request's answer says what failed)
      if len(batch) > 1:
        log.warning("a batch of %d requests failed (%s: %s): each is translated alone",
                    len(batch), type(e).__name__, str(e).splitlines()[0] if str(e) else "")
        for job in batch:
          self._answer([job])
        return
      log.exception("a request of %d sentences failed", len(sentences))
      batch[0].loop.call_soon_threadsafe(_set, batch[0].future, None, e)
      return
    self.metrics.batch(len(sentences), time.perf_counter() - began)
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
