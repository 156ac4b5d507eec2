"""Micro-batching: concurrent requests share engine calls up to the batch size, never across
decoding options; each gets its own answers; a full queue refuses; closing answers all."""

import asyncio
import threading

import pytest

from transformer_jax.serving.batcher import Batcher, Closed, QueueFull
from transformer_jax.serving.metrics import Metrics
from transformer_jax.serving.service import Options


class Slow:
  """Answers each sentence with itself and the options; the first call waits for `gate`."""

  def __init__(self, gate=None):
    self.calls, self.gate = [], gate

  def translate(self, sentences, prefixes, options):
    if self.gate is not None and not self.calls:
      self.gate.wait(5)
    self.calls.append((list(sentences), options))
    return [[{"translation": s, "options": options}] for s in sentences]


def test_concurrent_requests_are_batched_by_options_and_answered_their_own():
  gate = threading.Event()
  engine = Slow(gate)
  batcher = Batcher(engine, Metrics(), max_sentences=4, max_wait_s=0.05)
  beam = Options((("beam_size", 2),))

  async def main():
    first = asyncio.create_task(batcher.translate(["warm"], [""], Options()))
    await asyncio.sleep(0.1)  # (the engine is busy with it: the rest queue up)
    tasks = [asyncio.create_task(batcher.translate([f"s{i}", f"t{i}"], ["", ""],
                                                   beam if i % 2 else Options()))
             for i in range(6)]
    await asyncio.sleep(0.05)
    gate.set()
    return await first, await asyncio.gather(*tasks)

  first, answers = asyncio.run(main())
  batcher.close()
  assert first == [[{"translation": "warm", "options": Options()}]]
  for i, answer in enumerate(answers):
    assert [a[0]["translation"] for a in answer] == [f"s{i}", f"t{i}"]
    assert all(a[0]["options"] == (beam if i % 2 else Options()) for a in answer)
  # Two requests of 2 per call of 4, the first waiting request's options first; a call's
  # sentences all from requests with its options.
  assert [sentences for sentences, _ in engine.calls[1:]] == [
      ["s0", "t0", "s2", "t2"], ["s1", "t1", "s3", "t3"], ["s4", "t4"], ["s5", "t5"]]
  for sentences, options in engine.calls[1:]:
    assert {int(s[1:]) % 2 for s in sentences} == {int(options == beam)}


def test_a_full_queue_refuses_and_a_closed_batcher_answers_what_it_took():
  gate = threading.Event()
  batcher = Batcher(Slow(gate), Metrics(), max_sentences=2, max_wait_s=0.0, max_queue=3)

  async def main():
    busy = asyncio.create_task(batcher.translate(["a"], [""], Options()))
    await asyncio.sleep(0.1)
    waiting = asyncio.create_task(batcher.translate(["b", "c", "d"], ["", "", ""], Options()))
    await asyncio.sleep(0.05)
    with pytest.raises(QueueFull):
      await batcher.translate(["e"], [""], Options())
    closing = asyncio.get_running_loop().run_in_executor(None, batcher.close)
    await asyncio.sleep(0.05)
    with pytest.raises(Closed):
      await batcher.translate(["f"], [""], Options())
    gate.set()
    await closing
    return await busy, await waiting

  busy, waiting = asyncio.run(main())
  assert [a[0]["translation"] for a in busy + waiting] == ["a", "b", "c", "d"]


def test_a_request_past_its_deadline_leaves_the_queue_untranslated():
  gate = threading.Event()
  engine = Slow(gate)
  batcher = Batcher(engine, Metrics(), max_sentences=2, max_wait_s=0.0)

  async def main():
    busy = asyncio.create_task(batcher.translate(["a"], [""], Options()))
    await asyncio.sleep(0.1)
    with pytest.raises(asyncio.TimeoutError):
      await asyncio.wait_for(batcher.translate(["late"], [""], Options()), 0.05)
    gate.set()
    return await busy

  asyncio.run(main())
  batcher.close()
  assert [sentences for sentences, _ in engine.calls] == [["a"]]


def test_seeded_requests_share_a_batch_only_with_the_same_seed():
  """(a sample's key is its seed and its own sentence: requests of one seed may share)"""
  gate = threading.Event()
  engine = Slow(gate)
  batcher = Batcher(engine, Metrics(), max_sentences=8, max_wait_s=0.05)
  seeded, other = Options((("sampling", True),), seed=3), Options((("sampling", True),), seed=4)

  async def main():
    busy = asyncio.create_task(batcher.translate(["a"], [""], Options()))
    await asyncio.sleep(0.1)
    tasks = [asyncio.create_task(batcher.translate([s], [""], options))
             for s, options in (("x", seeded), ("y", seeded), ("z", other))]
    await asyncio.sleep(0.05)
    gate.set()
    await busy
    return await asyncio.gather(*tasks)

  asyncio.run(main())
  batcher.close()
  assert [sentences for sentences, _ in engine.calls] == [["a"], ["x", "y"], ["z"]]


def test_a_steady_load_keeps_full_batches_instead_of_alternating_halves():
  """Eight clients in a closed loop, the second four arriving while the first four's batch
  runs: the batch after it waits (up to max_wait from the engine's answer) for the four it
  answered to send again, so the two halves merge into batches of eight. (Waiting only
  max_wait from each batch's first request, the halves alternate: 4, 4, 4, ...)"""
  class Timed(Slow):
    def translate(self, sentences, prefixes, options):
      threading.Event().wait(0.3)
      return super().translate(sentences, prefixes, options)

  engine = Timed()
  batcher = Batcher(engine, Metrics(), max_sentences=8, max_wait_s=0.1)

  async def client(name: str, start: float):
    await asyncio.sleep(start)
    for turn in range(4):
      await batcher.translate([f"{name}{turn}"], [""], Options())
      await asyncio.sleep(0.005)  # (a client's round trip)

  async def main():
    await asyncio.gather(*(client(f"c{i}-", 0.0 if i < 4 else 0.2) for i in range(8)))

  asyncio.run(main())
  batcher.close()
  sizes = [len(sentences) for sentences, _ in engine.calls]
  assert sum(sizes) == 32 and sizes[-4:] == [8, 8, 8, 4], sizes  # (the first four: 1 to 4)


def test_a_request_that_leaves_while_its_batch_waits_for_more_stops_nothing():
  """The only waiting request's deadline passes while the batcher waits for the clients the
  last batch answered: the batcher goes on (it once died there, and every later request
  timed out)."""
  engine = Slow()
  batcher = Batcher(engine, Metrics(), max_sentences=8, max_wait_s=1.0)

  async def main():
    await batcher.translate(["a", "b"], ["", ""], Options())  # (then it waits for two)
    with pytest.raises(asyncio.TimeoutError):
      await asyncio.wait_for(batcher.translate(["late"], [""], Options()), 0.05)
    await asyncio.sleep(1.1)  # (past the wait: the batcher looks at its queue again)
    return await asyncio.wait_for(batcher.translate(["c"], [""], Options()), 2)

  assert asyncio.run(main()) == [[{"translation": "c", "options": Options()}]]
  batcher.close()
  assert [sentences for sentences, _ in engine.calls] == [["a", "b"], ["c"]]


def test_two_workers_translate_two_shares_of_a_steady_load_at_once():
  """Eight clients in a closed loop and two workers: each batch is at most half of the
  sentences the server holds, mostly exactly half, two translated at the same time (the
  engine sees two calls at once), every client answered its own sentences."""
  class Concurrent(Slow):
    def __init__(self):
      super().__init__()
      self.lock, self.now, self.most = threading.Lock(), 0, 0

    def translate(self, sentences, prefixes, options):
      with self.lock:
        self.now += 1
        self.most = max(self.most, self.now)
      threading.Event().wait(0.2)
      with self.lock:
        self.now -= 1
      return super().translate(sentences, prefixes, options)

  engine = Concurrent()
  batcher = Batcher(engine, Metrics(), max_sentences=8, max_wait_s=0.1, workers=2)

  async def client(name: str):
    answers = []
    for turn in range(5):
      answers += await batcher.translate([f"{name}{turn}"], [""], Options())
      await asyncio.sleep(0.005)  # (a client's round trip)
    return answers

  async def main():
    return await asyncio.gather(*(client(f"c{i}-") for i in range(8)))

  answers = asyncio.run(main())
  batcher.close()
  assert [[a[0]["translation"] for a in mine] for mine in answers] == [
      [f"c{i}-{turn}" for turn in range(5)] for i in range(8)]
  sizes = [len(sentences) for sentences, _ in engine.calls]
  # (the first batches depend on how the clients' first requests arrive; none exceeds a
  # share, half of the eight sentences held)
  assert engine.most == 2 and sum(sizes) == 40 and max(sizes) == 4, sizes
  assert sizes.count(4) >= 6, sizes


def test_a_request_that_breaks_its_batch_fails_alone_and_the_others_are_translated():
  """A bad and a good request in one engine call (the call raises, as SentencePiece does for
  text it cannot encode): each is translated again alone; the good one gets its translation,
  the bad one the error."""
  class Picky(Slow):
    def translate(self, sentences, prefixes, options):
      answers = super().translate(sentences, prefixes, options)
      if "bad" in sentences:
        raise UnicodeEncodeError("utf-8", "bad", 0, 1, "surrogates not allowed")
      return answers

  gate = threading.Event()
  engine = Picky(gate)
  batcher = Batcher(engine, Metrics(), max_sentences=8, max_wait_s=0.05)

  async def main():
    busy = asyncio.create_task(batcher.translate(["a"], [""], Options()))
    await asyncio.sleep(0.1)
    good = asyncio.create_task(batcher.translate(["good", "fine"], ["", ""], Options()))
    bad = asyncio.create_task(batcher.translate(["bad"], [""], Options()))
    await asyncio.sleep(0.05)
    gate.set()
    await busy
    return await good, await asyncio.gather(bad, return_exceptions=True)

  good, (bad,) = asyncio.run(main())
  batcher.close()
  assert good == [[{"translation": "good", "options": Options()}],
                  [{"translation": "fine", "options": Options()}]]
  assert isinstance(bad, UnicodeEncodeError)
  assert [sentences for sentences, _ in engine.calls] == [
      ["a"], ["good", "fine", "bad"], ["good", "fine"], ["bad"]]
