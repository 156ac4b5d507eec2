"""A decoder's slots fed from other threads: the server's requests join the queue as they
arrive (`scheduler.Decoder.run` with more to come)."""

from __future__ import annotations

import collections
import logging
import threading
import weakref

from transformer_jax.decoding.scheduler import Decoder, Sentence

log = logging.getLogger(__name__)


class Stream:
  """A decoder's slots fed from other threads (the server's requests): sentences join the
  queue as they arrive and go into slots in that order, nobody waiting for a batch to form;
  each is delivered within `max_steps` steps of being done (at most that many pass between
  two looks at the queue). A failure of the decoder fails every sentence it holds (their
  `on_error`), and the next ones start afresh."""

  def __init__(self, decoder: Decoder, max_steps: int = 4):
    if max_steps < 1:
      raise ValueError(f"a stream looks at its queue every max_steps >= 1 steps, got {max_steps}")
    self.decoder, self.max_steps = decoder, max_steps
    self.inbox: list[Sentence] = []
    # (taken, not delivered yet: id -> sentence; weakly, so that a cancelled sentence the
    # decoder skipped goes once its client's request is gone)
    self.held = weakref.WeakValueDictionary()
    self.cond = threading.Condition()
    self.closed = False
    self.thread = threading.Thread(target=self._serve, name="decoder", daemon=True)
    self.thread.start()

  def put(self, sentences: list[Sentence]):
    with self.cond:
      if self.closed:
        raise RuntimeError("the decoder is closed")
      self.inbox.extend(sentences)
      self.cond.notify()

  def close(self):
    """No more sentences; those taken are decoded before the thread ends."""
    with self.cond:
      self.closed = True
      self.cond.notify()
    self.thread.join()

  def _held_until_delivered(self, sentence: Sentence) -> Sentence:
    deliver = sentence.deliver

    def delivered(tokens, scores):
      self.held.pop(id(sentence), None)
      deliver(tokens, scores)
    self.held[id(sentence)] = sentence
    sentence.deliver = delivered  # (the same object: the client may still cancel it)
    return sentence

  def _serve(self):
    while True:
      queue = collections.deque()

      def more(block: bool):
        with self.cond:
          while block and not self.inbox and not self.closed:
            self.cond.wait()
          queue.extend(self._held_until_delivered(s) for s in self.inbox)
          self.inbox.clear()
      try:
        self.decoder.run(queue, more, self.max_steps)
        return  # (closed and drained)
      except Exception as e:  # noqa: BLE001 (each waiting client is told; the thread goes on)
        log.exception("decoding failed")
        held = list(self.held.values())
        self.held = weakref.WeakValueDictionary()
        for sentence in held:
          if sentence.on_error is not None:
            sentence.on_error(e)
