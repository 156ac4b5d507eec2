"""One writer per workdir: an exclusive lock (`<workdir>/.lock`) that every command writing a
folder holds while it runs (train, evaluate into it, attention maps, average's output,
translate-corpus's output; export's folder, replaced as a whole, has `.<name>.lock` beside it).

The lock is `flock` on the file, which the kernel releases when its process ends in any way,
SIGKILL included, so a lock left by a dead run is simply taken over (the file then names the
dead holder, which the new one reports). Where it works: local filesystems; NFS (Linux maps
`flock` to NFS byte-range locks: a crashed client's lock lapses with its lease, ~90 s on NFSv4);
not across machines on FUSE object-store mounts (gcsfuse), whose locks are local to one machine.
In a multi-host run process 0 holds it for the run (its processes are one writer).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

import jax

from transformer_jax.errors import WorkdirBusy

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"


def _holder(path: Path) -> dict:
  try:
    return json.loads(path.read_text() or "{}")
  except (OSError, ValueError):
    return {}


def _describe(holder: dict) -> str:
  if not holder:
    return "another process"
  since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("since", 0)))
  return (f"pid {holder.get('pid')} on {holder.get('host')} ({holder.get('command')}, "
          f"since {since})")


@contextlib.contextmanager
def hold(workdir: str | Path, command: str, wait_seconds: float = 0.0,
         lock_path: str | Path | None = None,
         way_out: str = "wait for it to finish or use another workdir"):
  """Holds the workdir's lock for the `with` block; WorkdirBusy (naming the holder, then
  `way_out`) if another process holds it for longer than `wait_seconds`. Processes other than
  process 0 take none. `lock_path`: the lock file of a folder that is replaced as a whole (an
  export), kept beside it, instead of <workdir>/.lock (the folder is then not created here)."""
  if jax.process_index() != 0:
    yield
    return
  workdir = Path(workdir)
  path = Path(lock_path) if lock_path else workdir / LOCK_FILE
  path.parent.mkdir(parents=True, exist_ok=True)
  fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
  held = False
  try:
    deadline, said = time.time() + wait_seconds, False
    while True:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = True
        break
      except BlockingIOError:
        if time.time() >= deadline:
          raise WorkdirBusy(f"workdir {workdir} is in use by {_describe(_holder(path))}; "
                            f"{way_out}") from None
        if not said:
          log.warning("Waiting up to %.0f s for workdir %s, in use by %s", wait_seconds,
                      workdir, _describe(_holder(path)))
          said = True
        time.sleep(0.5)
    previous = _holder(path)
    if previous.get("pid") and previous.get("pid") != os.getpid():
      log.info("Workdir lock of %s taken over (it is no longer running)", _describe(previous))
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                              "command": command, "since": time.time()}).encode(), 0)
    log.info("Workdir lock taken by pid %d (%s)", os.getpid(), command)
    yield
  finally:
    if held:  # (a clean end leaves no holder named; a dead process's name stays)
      os.ftruncate(fd, 0)
      log.info("Workdir lock released by pid %d", os.getpid())  # (the lock trace: in order)
    os.close(fd)  # (releases the lock)
