"""Orbax checkpoints of {train state, data-iterator position} in <workdir>/checkpoints.

Saving is atomic (Orbax writes to a temporary folder and renames it), so an interrupted save
never replaces the last good checkpoint; only the oldest beyond `max_to_keep` are deleted.
"""

from __future__ import annotations

from pathlib import Path

import grain
import jax
import orbax.checkpoint as ocp
import logging

log = logging.getLogger(__name__)


class Checkpointer:
  """Saves and restores the train state together with the grain iterator's position."""

  def __init__(self, directory: str | Path, max_to_keep: int = 3):
    self.directory = Path(directory).absolute()
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=False)
    self.manager = ocp.CheckpointManager(
        self.directory, options=options, item_names=("state", "data"),
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "data": grain.checkpoint.CheckpointHandler()})

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, state, data_iterator=None):
    items = {"state": ocp.args.StandardSave(state)}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointSave(data_iterator)
    self.manager.save(step, args=ocp.args.Composite(**items), force=True)
    self.manager.wait_until_finished()
    log.info("Saved checkpoint at step %d in %s", step, self.directory)

  def restore(self, step: int, abstract_state, data_iterator=None):
    """Restores the state (shaped and sharded like `abstract_state`) and, when given, moves
    `data_iterator` to the saved position. Returns the state."""
    items = {"state": ocp.args.StandardRestore(abstract_state)}
    if data_iterator is not None:
      items["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
    restored = self.manager.restore(step, args=ocp.args.Composite(**items))
    log.info("Restored checkpoint at step %d from %s", step, self.directory)
    return restored["state"]

  def close(self):
    self.manager.close()


def abstract_like(tree):
  """ShapeDtypeStructs (with shardings) of a tree of arrays: the restore target."""
  return jax.tree_util.tree_map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
      if isinstance(x, jax.Array) else x, tree)
