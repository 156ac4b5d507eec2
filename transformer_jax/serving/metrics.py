"""The server's counters in Prometheus' text format (`GET /metrics`): requests and errors
by endpoint and status, request latency and batch sizes as histograms, the queue's depth and
sentences translated (a counter, and per second over the last minute), the engine's
seconds per batch (their sum over the wall time: how many workers were busy, on average; with
our engine in flight, per request), and the programs compiled or loaded since the warm-up
(0 under any load: every program is made before the port opens)."""

from __future__ import annotations

import bisect
import collections
import threading
import time

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
ENGINE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Histogram:
  def __init__(self, buckets):
    self.buckets, self.counts, self.sum, self.count = buckets, [0] * len(buckets), 0.0, 0

  def observe(self, value: float):
    index = bisect.bisect_left(self.buckets, value)
    if index < len(self.buckets):
      self.counts[index] += 1
    self.sum += value
    self.count += 1

  def lines(self, name: str) -> list[str]:
    out, running = [], 0
    for bound, n in zip(self.buckets, self.counts):
      running += n
      out.append(f'{name}_bucket{{le="{bound}"}} {running}')
    out += [f'{name}_bucket{{le="+Inf"}} {self.count}', f"{name}_sum {self.sum:.6f}",
            f"{name}_count {self.count}"]
    return out


class Metrics:
  """Thread-safe counters of one server."""

  def __init__(self, programs=None):
    """`programs()`: the count of programs the process has prepared (compiled or loaded);
    those prepared after the metrics were made (a warmed-up server's) are exported."""
    self.programs = programs
    self.programs_at_start = programs() if programs else 0
    self.lock = threading.Lock()
    self.requests = collections.Counter()  # (endpoint, status)
    self.latency = Histogram(LATENCY_BUCKETS)
    self.batch_sizes = Histogram(BATCH_BUCKETS)
    self.engine_seconds = Histogram(ENGINE_BUCKETS)
    self.sentences = 0
    self.recent = collections.deque()  # (time, sentences) of the last minute's batches
    self.queue_depth = 0

  def request(self, endpoint: str, status: int, seconds: float):
    with self.lock:
      self.requests[(endpoint, status)] += 1
      self.latency.observe(seconds)

  def batch(self, sentences: int, seconds: float):
    now = time.monotonic()
    with self.lock:
      self.batch_sizes.observe(sentences)
      self.engine_seconds.observe(seconds)
      self.sentences += sentences
      self.recent.append((now, sentences))
      while self.recent and self.recent[0][0] < now - 60:
        self.recent.popleft()

  def text(self) -> str:
    now = time.monotonic()
    with self.lock:
      lines = ["# TYPE transformer_jax_requests_total counter"]
      lines += [f'transformer_jax_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                for (e, s), n in sorted(self.requests.items())]
      errors = sum(n for (_, s), n in self.requests.items() if s >= 400)
      lines += ["# TYPE transformer_jax_request_errors_total counter",
                f"transformer_jax_request_errors_total {errors}",
                "# TYPE transformer_jax_request_seconds histogram",
                *self.latency.lines("transformer_jax_request_seconds"),
                "# TYPE transformer_jax_batch_sentences histogram",
                *self.batch_sizes.lines("transformer_jax_batch_sentences"),
                "# TYPE transformer_jax_batch_engine_seconds histogram",
                *self.engine_seconds.lines("transformer_jax_batch_engine_seconds"),
                "# TYPE transformer_jax_queue_sentences gauge",
                f"transformer_jax_queue_sentences {self.queue_depth}",
                "# TYPE transformer_jax_sentences_total counter",
                f"transformer_jax_sentences_total {self.sentences}",
                "# TYPE transformer_jax_programs_after_warm_up_total counter",
                "transformer_jax_programs_after_warm_up_total "
                f"{self.programs() - self.programs_at_start if self.programs else 0}",
                "# TYPE transformer_jax_sentences_per_second gauge",
                "transformer_jax_sentences_per_second "
                f"{sum(n for t, n in self.recent if t >= now - 60) / 60:.3f}"]
    return "\n".join(lines) + "\n"
