"""The host's side of decoding in flight (`slots`): which sentence goes into which slot when,
at which width class, and each one's result collected the moment its search is done.

A `Decoder` holds N slots of one kind (beam search of W beams, or greedy/sampling rows) and
feeds them from a queue: a whole file sorted longest first (the last sentences to finish are
then short ones, and the slots narrow as the long ones leave), or the server's requests in
arrival order (`stream.Stream`). Each program call puts up to K new sentences into free slots,
then steps every live slot until min(K, waiting) more have finished (so that the next call
refills them) or, for the server, a few steps have run (a finished sentence waits at most
that long for its answer, and a request that arrives meanwhile for a slot: calls of several
steps each, not one per finished sentence, whose insert and look at the slots would cost
as much as the steps).

Width classes (`width_classes`): sources are padded to the smallest of a few widths, each
with a cache length; the slots run at the class of the widest sentence they hold or take
next, and move to another only when every sentence in them fits it (`slots.resized`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import os
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.decoding import slots as slots_lib
from transformer_jax.decoding.beam_caches import shares_caches
from transformer_jax.decoding.width_classes import Geometry
from transformer_jax.parallel import compilation
from transformer_jax.parallel import mesh as mesh_lib


@dataclasses.dataclass
class Sentence:
  """One sentence to decode and where its result goes."""
  source: np.ndarray              # its ids (EOS included)
  cap: int                        # the most tokens its translation may have (EOS included)
  options: dict                   # `slots.SlotOptions` field -> its value
  prefix: np.ndarray | None = None  # target ids to force first
  key: np.ndarray | None = None   # (2,) uint32: its sampling key
  # deliver(tokens (W, cap) or (cap,), scores (W,) or ()) when it is done
  deliver: Callable | None = None
  cancelled: bool = False         # not to be decoded (its client left): skipped if waiting
  on_error: Callable | None = None  # on_error(exception): its decoding failed (`Stream`)
  width_class: int = -1           # the smallest width class that holds it (-1: not known yet)


def _from_full(tree, sharding_of):
  """Each array of `tree`, of which every host holds all, placed by `sharding_of(array)`."""
  return jax.tree_util.tree_map(lambda x: jax.make_array_from_callback(
      np.shape(x), sharding_of(x), lambda idx, x=np.asarray(x): x[idx]), tree)


class Decoder:
  """N slots of one kind decoding with `scorer` (`ensemble.prepare`'s): beam search of
  `beam_size` beams ("flat" or "gather" caches: `beam_caches`), or greedy/sampling rows
  (`beam_size` 0). On `mesh`, the slots are split over its batch axes. `every_option`:
  the rules and sampling compiled in (`slots.Slots`)."""

  def __init__(self, scorer, geometry: Geometry, beam_size: int = 0, beam_impl: str = "auto",
               mesh=None, every_option: bool = True):
    self.scorer, self.geometry, self.mesh = scorer, geometry, mesh
    self.beam_size, self.flat = beam_size, beam_size > 0 and shares_caches(beam_impl)
    self.every_option = every_option
    self.advance = slots_lib.beam_advance if beam_size else slots_lib.greedy_advance
    self.counts = collections.Counter()  # program calls, steps, resizes (`run`)
    self._shapes = {}  # class -> the slots' ShapeDtypeStructs
    self._jobs = {}  # ("advance", class) or ("resize", from, to) -> its preparation (`prepare`)
    self._pool = None  # (the threads preparing them)

  # --- the slots on the device ---

  def _empty(self, cls: int):
    """Free slots at class `cls`, on the device (each option at its value in a free slot:
    a rule off)."""
    state = jax.tree_util.tree_map(lambda x: np.zeros(x.shape, x.dtype),
                                   self._slots_shapes(cls))
    state = state.replace(options=slots_lib.SlotOptions(**{
        name: np.full((self.geometry.slots,), value, dtype)
        for name, (value, dtype) in slots_lib.OPTION_DEFAULTS.items()}))
    return self._placed(state)

  def _slots_shapes(self, cls: int):
    """The slots' arrays at class `cls` as ShapeDtypeStructs."""
    if cls not in self._shapes:
      self._shapes[cls] = self._traced_shapes(cls)
    return self._shapes[cls]

  def _traced_shapes(self, cls: int):
    g = self.geometry
    N, S, C = g.slots, g.widths[cls], g.capacities[cls]
    rows = max(self.beam_size, 1)
    inputs = jax.ShapeDtypeStruct((N, S), jnp.int32)
    cache = jax.eval_shape(lambda scorer, i: scorer.new_cache(i, rows, C, self.flat),
                           self.scorer, inputs)  # (the scorer's arrays may be abstract)
    axes = tuple(jax.tree_util.tree_leaves(self.scorer.cache_axes(cache)))
    if self.beam_size:
      return jax.eval_shape(lambda c: slots_lib.empty_beam_slots(
          c, axes, N, S, C, self.beam_size, self.flat, self.every_option), cache)
    return jax.eval_shape(lambda c: slots_lib.empty_greedy_slots(
        c, axes, N, S, C, self.every_option), cache)

  def abstract(self, cls: int) -> tuple:
    """(the slots, the arrivals, release_at, max_steps) of an advance at class `cls` as
    ShapeDtypeStructs, placed on the mesh as `run` places them: what the compile tool lowers
    for another platform."""
    def placed(tree, sharding):
      return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(
          x.shape, x.dtype, sharding=None if sharding is None else sharding(x)), tree)
    split = whole = None
    if self.mesh is not None:
      split = lambda x: mesh_lib.batch_sharding(self.mesh) if x.ndim else (  # noqa: E731
          mesh_lib.replicated(self.mesh))
      whole = lambda x: mesh_lib.replicated(self.mesh)  # noqa: E731
    arrivals = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                      self._arrivals(cls, []))
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    return (placed(self._slots_shapes(cls), split), placed(arrivals, whole), scalar, scalar)

  def lowered(self, cls: int) -> dict:
    """The programs at class `cls`, each a function returning its `jax.stages.Lowered`:
    "advance" (arrivals put into slots, the search loop) and "step" (one step of every slot:
    the loop's loop-free twin)."""
    state, arrivals, release_at, max_steps = self.abstract(cls)
    step = slots_lib.beam_step if self.beam_size else slots_lib.greedy_step
    return {"advance": lambda: self.advance.lower(self.scorer, state, arrivals, release_at,
                                                  max_steps),
            "step": lambda: jax.jit(step).lower(self.scorer, state)}

  def _placed(self, tree):
    """`tree` on the device (split over the mesh's batch axes, first axis: the slots):
    committed to the device the model is on, as a program's outputs are (an uncommitted
    input would make the next call, on the outputs, another program)."""
    if self.mesh is None:
      device = next(iter(jax.tree_util.tree_leaves(self.scorer)[0].devices()))
      return jax.device_put(tree, device)
    split, whole = mesh_lib.batch_sharding(self.mesh), mesh_lib.replicated(self.mesh)
    return _from_full(tree, lambda x: split if np.ndim(x) else whole)

  def _replicated(self, tree):
    """`tree` (numpy arrays) whole on every device of the mesh, as it is without one."""
    if self.mesh is None:
      return tree
    whole = mesh_lib.replicated(self.mesh)
    return _from_full(tree, lambda x: whole)

  def _arrivals(self, cls: int, todo: list[tuple[int, Sentence]]):
    """The `slots.Arrivals` of `todo` ((slot, sentence) pairs) at class `cls`, K rows, as
    numpy arrays (`_replicated` places them)."""
    g = self.geometry
    K, S, C = g.arrivals, g.widths[cls], g.capacities[cls]
    slot = np.full((K,), g.slots, np.int32)
    inputs, caps = np.zeros((K, S), np.int32), np.zeros((K,), np.int32)
    prefix, keys = np.zeros((K, C), np.int32), np.zeros((K, 2), np.uint32)
    fields = {name: [] for name in slots_lib.OPTION_DEFAULTS}
    for k in range(K):
      if k < len(todo):
        slot[k], sentence = todo[k]
        inputs[k, :len(sentence.source)] = sentence.source
        caps[k] = sentence.cap
        if sentence.prefix is not None:
          prefix[k, :len(sentence.prefix)] = sentence.prefix
        if sentence.key is not None:
          keys[k] = sentence.key
      for name, values in fields.items():
        value = todo[k][1].options.get(name) if k < len(todo) else None
        values.append(slots_lib.OPTION_DEFAULTS[name][0] if value is None else value)
    options = slots_lib.SlotOptions(**{  # (numpy: no program of its own to make them)
        name: np.asarray(values, slots_lib.OPTION_DEFAULTS[name][1])
        for name, values in fields.items()})
    return slots_lib.Arrivals(slot=slot, inputs=inputs, caps=caps, prefix=prefix, keys=keys,
                              options=options)

  def _resized(self, state, cls: int, to: int):
    while cls != to:  # (through the neighbouring classes: a program per neighbour)
      self._ready("resize", cls, cls + (1 if to > cls else -1))
      cls += 1 if to > cls else -1
      state = slots_lib.resized(state, width=self.geometry.widths[cls],
                                capacity=self.geometry.capacities[cls])
      self.counts["resizes"] += 1
    return state

  def _collect(self, state, done: list[tuple[int, Sentence]]):
    """Hands each done sentence its result."""
    if self.beam_size:
      seqs, scores = mesh_lib.fetch(state.finished_seqs), mesh_lib.fetch(state.finished_scores)
    else:
      seqs, scores = mesh_lib.fetch(state.seqs), mesh_lib.fetch(state.logprobs)
    for slot, sentence in done:  # (its tokens, as long as its cap)
      tokens = np.zeros(seqs.shape[1:-1] + (max(sentence.cap, 1),), np.int32)
      width = min(tokens.shape[-1], seqs.shape[-1])
      tokens[..., :width] = seqs[slot, ..., :width]
      sentence.deliver(tokens, scores[slot])

  # --- the queue ---

  def run(self, queue, more: Callable | None = None, max_steps: int = 0):
    """Decodes every `Sentence` of `queue` (a deque, taken from its left) and those that
    `more(block)` adds to it (the server's arrivals; block: whether it may wait for one,
    nothing being in flight); each one's `deliver` is called once the call that finished it
    returns.
    `max_steps`: the most steps between two looks at the queue (0: no limit): how long a
    finished sentence may wait to be delivered, and an arrival for a slot."""
    g = self.geometry
    free, live = list(range(g.slots))[::-1], {}  # (slot -> sentence)
    state, cls, longest = None, None, 0  # (longest: the most tokens a live slot has)
    while True:
      if more is not None:
        more(not live and not queue)
      if not queue and not live:
        return
      upcoming = [self.class_of(s) for s in itertools.islice(queue, g.arrivals)]
      target = max([self.class_of(s) for s in live.values()] + upcoming
                   + [g.class_for_step(longest, g.slots if cls is None else cls)])
      if state is None:
        state, cls = self._empty(target), target
      elif target != cls:
        state, cls = self._resized(state, cls, target), target
      todo = []
      while queue and free and len(todo) < g.arrivals:
        if queue[0].cancelled:
          queue.popleft()
          continue
        if self.class_of(queue[0]) > cls:
          break
        slot = free.pop()
        live[slot] = queue.popleft()
        todo.append((slot, live[slot]))
      # (the loop stops once this many slots are free or done: enough to refill; with none
      # waiting, all of them, or for the server after max_steps, which bounds how long a
      # finished sentence waits for its answer and an arrival for a slot)
      waiting = len(queue)
      release_at = min(g.arrivals, waiting) if waiting else g.slots + 1
      steps = max_steps or 1 << 30
      arrivals = self._replicated(self._arrivals(cls, todo))
      self._ready("advance", cls)
      state, active, ran = self.advance(self.scorer, state, arrivals, np.int32(release_at),
                                        np.int32(steps))
      active, steps = mesh_lib.fetch(active), mesh_lib.fetch(state.steps)
      longest = max((int(steps[slot]) for slot in live if active[slot]), default=0)
      self.counts["calls"] += 1
      self.counts[f"steps at width {g.widths[cls]}"] += int(mesh_lib.fetch(ran))
      done = [(slot, s) for slot, s in live.items() if not active[slot]]
      if done:
        self._collect(state, done)
        for slot, _ in done:
          del live[slot]
          free.append(slot)

  def prepare(self, classes, moves=(), wait: bool = True) -> int:
    """Makes ready (compiles, or loads from the store) the advance of each class of
    `classes` and the resize of each (from, to) of `moves`, without decoding: the advances
    widest first on a thread of their own (on a CPU one: XLA:CPU compiles on both cores
    already), the resizes on this one meanwhile; on a mesh all here, in one order (a second
    thread's programs would interleave the devices' collectives). `wait` False: in the
    background while the wider classes decode (`run` waits at a class for its advance only:
    the same classes at the same steps, the same results). Returns how many programs."""
    advances = [("advance", c) for c in sorted(set(classes), reverse=True)]
    resizes = [("resize", a, b) for a, b in sorted(set(moves))]
    todo = [job for job in advances + resizes if job not in self._jobs]  # (once per decoder)
    on_mesh = self.mesh is not None or jax.process_count() > 1
    here = [job for job in todo if job[0] == "resize" or on_mesh]
    if len(here) < len(todo) and self._pool is None:
      workers = 1 if jax.default_backend() == "cpu" else max(1, os.cpu_count() or 1)
      self._pool = concurrent.futures.ThreadPoolExecutor(
          workers, thread_name_prefix="compile", initializer=compilation.in_background)
    for job in todo:
      if job not in here:
        self._jobs[job] = self._pool.submit(self._prepare_job, job)
    for job in here:
      self._jobs[job] = done = concurrent.futures.Future()
      try:
        done.set_result(self._prepare_job(job))
      finally:
        if not done.done():  # (failed: tried again when next asked)
          del self._jobs[job]
    if wait:
      for job in advances:
        self._ready(*job)
    return len(todo)

  def _prepare_job(self, job):
    (self._prepare_advance if job[0] == "advance" else self._prepare_resize)(*job[1:])

  def _ready(self, *job):
    """Waits for `job`'s program if it is being prepared, a wait counted as preparing (a
    failed job raises, and is forgotten: tried again when next asked)."""
    preparing, started = self._jobs.get(job), time.perf_counter()
    try:
      if preparing is not None:
        preparing.result()
    except BaseException:
      self._jobs.pop(job, None)
      raise
    finally:
      compilation.waited(time.perf_counter() - started)

  def cancel_pending(self):
    """Drops the preparations not started yet (of classes a set did not reach)."""
    for job, preparing in list(self._jobs.items()):
      if preparing.cancel():
        del self._jobs[job]

  def _prepare_advance(self, cls: int):
    self.advance(self.scorer, self._empty(cls), self._replicated(self._arrivals(cls, [])),
                 np.int32(1), np.int32(0))  # (empty slots: nothing to do)

  def _prepare_resize(self, cls: int, to: int):
    slots_lib.resized(self._empty(cls), width=self.geometry.widths[to],
                      capacity=self.geometry.capacities[to])

  def class_of(self, sentence: Sentence) -> int:
    """The smallest width class that holds `sentence` (kept on it: computed once)."""
    if sentence.width_class < 0:
      prefix = 0 if sentence.prefix is None else int(np.count_nonzero(sentence.prefix))
      sentence.width_class = self.geometry.class_of(len(sentence.source), prefix)
    return sentence.width_class

  def programs_of(self, sentences: list[Sentence]) -> tuple[list[int], list[tuple]]:
    """(the width classes, the moves between them) that decoding `sentences` longest first
    runs through: each class from the widest of theirs down to the narrowest, each narrowing
    on the way (a translation that outgrows its class's cache may still widen it)."""
    found = [self.class_of(s) for s in sentences]
    if not found:
      return [], []
    classes = list(range(min(found), max(found) + 1))
    return classes, [(c + 1, c) for c in classes[:-1]]

  def programs(self, narrowest: int = 0) -> int:
    """Prepares every program of these slots (`narrowest` > 0: of that many narrowest
    classes): each class, each resize between neighbours both ways (a server's warm-up)."""
    classes = range(min(narrowest or len(self.geometry.widths), len(self.geometry.widths)))
    moves = [(c, c + 1) for c in classes[:-1]] + [(c + 1, c) for c in classes[:-1]]
    return self.prepare(classes, moves)
