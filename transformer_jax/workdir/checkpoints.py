"""Orbax checkpoints of {train state, data-iterator position} in <workdir>/checkpoints, and
which of them a selection string (`latest`, `average:5`, ...) names.

Saving is asynchronous: `save` returns once the arrays are copied to host memory, and Orbax
writes them in a background thread while training goes on (the next save, a restore and
`close` wait for it). It is atomic (Orbax writes to a temporary folder and renames it when
complete), so a save interrupted at any point never replaces the last good checkpoint; only
the oldest beyond `max_to_keep` are deleted, after a newer one is complete.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import sys
import time
import warnings
from pathlib import Path

import grain
import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from transformer_jax.errors import CheckpointError, Interrupted
from transformer_jax.workdir import layout

log = logging.getLogger(__name__)


def barrier_prefix(directory: Path) -> str:
  """What names a checkpoint folder's cross-host barriers: its place in its run, the same on
  every host whatever the path the workdir is mounted at (`checkpoints_best`, a population
  member's `members_0_checkpoints`)."""
  if directory.parent.parent.name == layout.MEMBERS:
    return "_".join(directory.parts[-3:])
  return directory.name


class Checkpointer:
  """Saves and restores the train state together with the grain iterator's position.

  With `best_metric`, it keeps only the `max_to_keep` checkpoints with the highest value of
  that metric (passed to `save`), instead of the newest ones.
  """

  def __init__(self, directory: str | Path, max_to_keep: int = 3, best_metric: str = ""):
    self.directory = Path(directory).absolute()
    self.best_metric = best_metric
    _drop_reports_of_abandoned_reads()
    best = dict(best_fn=lambda metrics: metrics[best_metric], best_mode="max",
                keep_checkpoints_without_metrics=False) if best_metric else {}
    # Orbax names a save's cross-host barriers by its step alone, so a run's newest and best
    # checkpoints saved at one step on several hosts would meet at each other's barriers (and
    # time out). The folder tells them apart: its last parts, the same on every host that
    # shares the workdir wherever it is mounted.
    barriers = ocp.options.MultiprocessingOptions(
        barrier_sync_key_prefix=barrier_prefix(self.directory))
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=True,
                                           multiprocessing_options=barriers, **best)
    self.manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "data"),
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "data": grain.checkpoint.CheckpointHandler()})

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def best_step(self) -> int | None:
    return self.manager.best_step()

  def best_value(self) -> float:
    """The best checkpoint's `best_metric` as saved with it; -inf when there is none."""
    step = self.best_step()
    metrics = self.manager.metrics(step) if step is not None else None
    return float(metrics[self.best_metric]) if metrics else float("-inf")

  def save(self, step: int, state, data_iterator=None, metrics: dict | None = None):
    if step in self.all_steps():  # a resumed run redoing saved steps: the same state again
      log.info("Checkpoint at step %d already in %s", step, self.directory)
      return
    self._check_space(step, state)
    items = {"state": ocp.args.StandardSave(state)}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    start = time.perf_counter()
    self.manager.save(step, args=ocp.args.Composite(**items), force=True, metrics=metrics)
    log.info("Saving checkpoint at step %d in %s (blocked %.2f s; written in the background)",
             step, self.directory, time.perf_counter() - start)

  def _check_space(self, step: int, state):
    """A save that cannot fit is refused before Orbax writes a byte (its writers failing
    half-way on a full disk flood the log): ENOSPC naming the checkpoint when the filesystem
    has less free space than the state's bytes and a margin. One process only: with several,
    each would decide alone, and a save is collective."""
    if jax.process_count() > 1:
      return
    needed = 1.1 * sum(getattr(x, "nbytes", 0) for x in jax.tree_util.tree_leaves(state)) + 2**20
    self.directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(self.directory).free
    if free < needed:
      raise OSError(errno.ENOSPC, f"No space left on device ({free / 2**20:.1f} MiB free, the "
                    f"checkpoint needs about {needed / 2**20:.1f} MiB)",
                    str(self.directory / str(step)))

  def wait(self):
    """Returns once the save in flight (if any) is complete on disk."""
    self.manager.wait_until_finished()

  def restore(self, step: int, abstract_state, data_iterator=None,
              fields: tuple[str, ...] | None = None):
    """Restores the state (shaped and sharded like `abstract_state`) and, when given, moves
    `data_iterator` to the saved position. Returns the state. With `fields` (e.g.
    ("ema_params",): what decoding needs), only those of the state's fields are read, the
    others left as placeholders: a fraction of the checkpoint's bytes."""
    self.wait()
    if step not in self.all_steps():
      raise CheckpointError(f"no checkpoint for step {step} in {self.directory}; available "
                            f"steps: {self.all_steps() or 'none'}")
    try:
      if fields is not None:
        state = _restore_fields(self.directory / str(step) / "state", abstract_state, fields)
      else:
        items = {"state": ocp.args.StandardRestore(abstract_state)}
        if data_iterator is not None:
          items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
        state = self.manager.restore(step, args=ocp.args.Composite(**items))["state"]
    except Exception:  # noqa: BLE001 (what a vanished file raises depends on where it vanished)
      if (self.directory / str(step)).exists():
        raise
      raise CheckpointError(
          f"checkpoint step {step} in {self.directory} was deleted while it was read (a "
          "training run writing that workdir keeps only its newest checkpoints): select a "
          "newer one, or evaluate when the run has ended") from None
    log.info("Restored checkpoint at step %d from %s", step, self.directory)
    return state

  def restore_latest(self, abstract_state, data_iterator=None):
    """(step, state) of the newest checkpoint that restores, or (0, None) when there is none.

    Newer checkpoints that fail to restore while an older one restores are damaged (files
    missing, truncated or corrupt): each is moved out of the way, to <checkpoints>_damaged/
    <step>, with a warning naming it; nothing is deleted, and a later save of that step
    cannot collide with it. When none restores, the cause is not damage to one checkpoint:
    that is an error, and nothing is moved. A checkpoint of another shape (another model
    config) is an error too.
    """
    failed = []
    for step in reversed(self.all_steps()):
      state, damage = self.read(step, abstract_state, data_iterator)
      if damage:
        failed.append((step, damage))
        continue
      for bad, reason in failed:
        log.warning("checkpoint at step %d in %s is damaged (%s); moved to %s; resuming from "
                    "step %d", bad, self.directory, reason, self._set_aside(bad), step)
      return step, state
    if failed:
      raise CheckpointError(
          f"no checkpoint in {self.directory} can be restored (nothing was moved or deleted): "
          + "; ".join(f"step {step}: {reason}" for step, reason in failed))
    return 0, None

  def read(self, step: int, abstract_state, data_iterator=None,
           fields: tuple[str, ...] | None = None):
    """(state, None), or (None, why) when the checkpoint of `step` is damaged: there, but
    failing to restore (`why`: the read that failed, not the layers that wrap it, in one
    line). One that is missing, deleted while read, or of another model stays an error, as
    does a stop asked for meanwhile (SIGTERM under translate-corpus) or memory running out."""
    self.check_shapes(step, abstract_state)
    try:
      return self.restore(step, abstract_state, data_iterator, fields), None
    except (CheckpointError, Interrupted, MemoryError):
      raise
    except Exception as e:  # noqa: BLE001 (what a damaged file raises depends on the file)
      while e.__cause__ is not None:
        e = e.__cause__
      return None, _one_line(e)

  def check_shapes(self, step: int, abstract_state):
    """Raises CheckpointError when the saved arrays' shapes differ from the state's."""
    # (a damaged checkpoint's metadata: Orbax warns that it cannot restore that item, and the
    # restore that follows says why, in one line)
    absl_log, level = logging.getLogger("absl"), logging.getLogger("absl").level
    absl_log.setLevel(logging.ERROR)
    try:
      saved = self.manager.item_metadata(step)["state"]
    except (Interrupted, MemoryError):  # (a stop asked for meanwhile is no damage)
      raise
    except Exception:  # noqa: BLE001 (unreadable metadata: damage, found by the restore)
      return
    finally:
      absl_log.setLevel(level)
    if saved is None:
      return
    expected = shapes_by_path(abstract_state)
    found = shapes_by_path(saved)
    problems = [f"{'/'.join(k)}: saved {found[k]}, config {shape}"
                for k, shape in expected.items() if k in found and found[k] != shape]
    if problems:
      raise CheckpointError(
          f"checkpoint at step {step} in {self.directory} does not match the config's model "
          f"({len(problems)} array(s) differ, e.g. {'; '.join(problems[:3])}); use the config "
          "it was trained with, or another --workdir")

  def _set_aside(self, step: int) -> Path:
    damaged = self.directory.with_name(self.directory.name + "_damaged")
    target = damaged / str(step)
    if jax.process_index() == 0:
      damaged.mkdir(exist_ok=True)
      n = 1
      while target.exists():
        target, n = damaged / f"{step}.{n}", n + 1
      (self.directory / str(step)).rename(target)
    if jax.process_count() > 1:  # the others wait for process 0's rename (shared storage)
      multihost_utils.sync_global_devices(f"set_aside_{step}")
    self.manager.reload()
    return target

  def close(self):
    self.manager.close()  # (waits for the save in flight)


def _restore_fields(path: Path, abstract_state, fields: tuple[str, ...]):
  """The state saved at `path` (a checkpoint's state item), only `fields` read. (Orbax's
  PyTree handler reads what the standard one wrote, placeholders left out.)"""
  skipped = {name: jax.tree_util.tree_map(lambda _: ocp.PLACEHOLDER, getattr(abstract_state, name))
             for name in ("params", "opt_state", "ema_params")
             if name not in fields and getattr(abstract_state, name, None) is not None}
  target = abstract_state.replace(**skipped)
  restore_args = jax.tree_util.tree_map(
      lambda x: ocp.ArrayRestoreArgs(sharding=x.sharding) if isinstance(x, jax.ShapeDtypeStruct)
      else ocp.RestoreArgs(), target)
  with ocp.Checkpointer(ocp.PyTreeCheckpointHandler()) as checkpointer:
    return checkpointer.restore(path, args=ocp.args.PyTreeRestore(item=target,
                                                                  restore_args=restore_args))


def _drop_reports_of_abandoned_reads():
  """Orbax runs a restore's reads in an event loop that it closes as soon as one fails, while
  TensorStore completes the others: each of those then reports "Event loop is closed", and
  each abandoned read its error, to sys.unraisablehook, or asyncio logs it when its task is
  collected, or Python warns that its coroutine was never awaited (thousands of lines for one
  damaged checkpoint, whose restore error already says what is wrong; a metadata read that
  fails leaves them too). Once a Checkpointer is made, this process drops those reports (they
  come as soon as a read fails, before its error reaches the caller); every other goes on to
  the hook before, to the log, or to the warnings shown."""
  previous = sys.unraisablehook
  if getattr(previous, "drops_abandoned_reads", False):
    return
  logging.getLogger("asyncio").addFilter(_not_an_abandoned_read)
  warnings.filterwarnings("ignore", "coroutine '(_read_shard|_read_array_index_and_device_put|"
                          "_read_and_create_array|async_deserialize|Store._get_array_metadatas)'"
                          " was never awaited", RuntimeWarning)
  warnings.filterwarnings("ignore", "coroutine '.*' was never awaited", RuntimeWarning,
                          module=r"orbax\.")  # (any other of Orbax's, reported where it was)

  def hook(unraisable):
    error, code = unraisable.exc_value, getattr(unraisable.object, "cr_code", None)
    closed = isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
    if not (closed or (code is not None and f"{os.sep}orbax{os.sep}" in code.co_filename)):
      previous(unraisable)
  hook.drops_abandoned_reads = True
  sys.unraisablehook = hook


def _not_an_abandoned_read(record: logging.LogRecord) -> bool:
  """False for asyncio's report of an Orbax (TensorStore) read that no one awaited any more."""
  message = str(record.msg)
  error = str(record.exc_info[1]).lower() if record.exc_info else ""
  return not (re.match(r"\w+ exception was never retrieved", message)
              and (f"{os.sep}orbax{os.sep}" in message or "tensorstore" in error
                   or "ocdbt" in error))


def _one_line(e: Exception) -> str:
  """An error as one line: its type and the first line of its message."""
  first = str(e).splitlines()[0][:300] if str(e) else ""
  return f"{type(e).__name__}: {first}"


def shapes_by_path(tree) -> dict[tuple[str, ...], tuple[int, ...]]:
  """{path as names: shape} of a tree's arrays, however the tree spells its keys (dataclass
  fields and dicts alike), so that a state and a checkpoint's metadata can be compared."""
  return {tuple(re.findall(r"\w+", jax.tree_util.keystr(path))): tuple(getattr(x, "shape", ()))
          for path, x in jax.tree_util.tree_leaves_with_path(tree)}


def abstract_like(tree):
  """ShapeDtypeStructs (with shardings) of a tree of arrays: the restore target."""
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
      if isinstance(x, jax.Array) else x, tree)


def average_states(states, fields: tuple[str, ...] | None = None):
  """The element-wise mean of the states' `fields` (default: the parameters, and their moving
  averages when they keep them; those a restore read, when it read only some), the other
  fields from the last state; one state as it is."""
  if not states:
    raise CheckpointError("nothing to average")
  if len(states) == 1:
    return states[0]
  fields = [f for f in fields or ("params", "ema_params")
            if getattr(states[-1], f, None) is not None]
  means = _mean([{f: getattr(s, f) for f in fields} for s in states])
  return states[-1].replace(**means)


@jax.jit
def _mean(trees):
  """The leaf-wise mean of the trees (one program, not one per leaf)."""
  return jax.tree_util.tree_map(lambda *xs: sum(xs) / len(xs), *trees)


def parse_selection(selection: str, available: list[int]) -> list[tuple[str, list[int]]]:
  """Which checkpoints to use: a list of (label, steps to average) from a selection string.

  `latest`, `all`, a step number, `average:N` (the last N), or `steps:A,B,...` (the average
  of those steps). (`best` lives in its own directory; see inference.trained_run.)
  """
  if not available:
    raise CheckpointError("the workdir has no checkpoints yet")
  if selection == "latest":
    return [(f"step_{available[-1]}", [available[-1]])]
  if selection == "all":
    return [(f"step_{s}", [s]) for s in available]
  if selection.startswith("average:"):
    if not selection.split(":", 1)[1].isdigit():
      raise CheckpointError(f"--checkpoint={selection}: average:N needs a whole number N of "
                            "checkpoints to average, e.g. average:5")
    n = int(selection.split(":", 1)[1])
    if n < 1 or n > len(available):
      raise CheckpointError(f"average:{n} needs 1..{len(available)} checkpoints; available "
                            f"steps: {available}")
    steps = available[-n:]
    return [(f"average_last_{n}_to_{steps[-1]}", steps)]
  if selection.startswith("steps:"):
    items = [x for x in selection.split(":", 1)[1].split(",") if x]
    if not items or not all(x.isdigit() for x in items):
      raise CheckpointError(f"--checkpoint={selection}: steps:A,B,... needs step numbers, e.g. "
                            f"steps:{','.join(map(str, available[-2:]))}")
    steps = [int(x) for x in items]
    missing = sorted(set(steps) - set(available))
    if missing:
      raise CheckpointError(f"no checkpoint for step(s) {missing}; available: {available}")
    return [(f"average_{'_'.join(map(str, steps))}", steps)]
  if selection.isdigit():
    step = int(selection)
    if step not in available:
      raise CheckpointError(f"no checkpoint for step {step}; available steps: {available}")
    return [(f"step_{step}", [step])]
  raise CheckpointError(f"--checkpoint={selection}: unknown checkpoint selection; expected "
                        "latest, best, all, a step, average:N or steps:A,B,...")
