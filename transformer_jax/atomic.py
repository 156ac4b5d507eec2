"""Writing files and folders so that a reader, or a crash at any point, sees the old version or
the new one, never a part: every file a run or a tool writes goes through here.

A file is written to a temporary name beside it (same folder, so the same filesystem), flushed
to disk, then renamed over the old one (`os.replace`, atomic on POSIX filesystems). The
temporary name holds the writer's host and pid: a writer killed mid-write (SIGKILL) leaves it,
and the next write of that file removes those of this host's processes that have ended. An OS
error writing it names the file and what is kept (`errors.on_write`). A folder
(an export) is swapped with its replacement by one atomic exchange (Linux `renameat2` with
RENAME_EXCHANGE); where that is unavailable, by two renames, the old folder kept beside until
the new one is in place (a crash between them leaves it there, named, to restore).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import json
import os
import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from transformer_jax import errors

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
  """Yields a temporary path to write `path`'s new content to; on leaving the block without
  an error it becomes `path` (flushed first), on an error it is removed and `path` is left
  as it was. An OSError of this write (not of another file read in the block) is marked with
  `path` and what is kept (`errors.on_write`)."""
  path = Path(path)
  tmp = path.with_name(f"{_tmp_prefix(path)}{socket.gethostname()}-{os.getpid()}")
  kept = "the one there is kept as it was" if path.exists() else "no part of it is left"
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_left_behind(path)
    yield tmp
    with open(tmp, "rb+") as f:
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except OSError as e:
    if _about(e, [tmp, path, *path.parents]):
      errors.on_write(e, path, kept)
    raise
  finally:
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):  # (none was made)
      tmp.unlink()


def _about(error: OSError, paths: list[Path]) -> bool:
  """Whether `error` is about one of `paths`, or about no file (a write to an open file)."""
  if error.filename is None:
    return True
  return isinstance(error.filename, (str, bytes, os.PathLike)) and \
      Path(os.fsdecode(error.filename)) in paths


def _tmp_prefix(path: Path) -> str:
  return f".{path.name}.tmp-"


def _remove_left_behind(path: Path):
  """Removes the temporary files of `path` that processes of this host left when they were
  killed mid-write (their pid no longer runs); another host's are left alone (its pids are
  not ours to ask about)."""
  pattern = re.compile(re.escape(_tmp_prefix(path) + socket.gethostname()) + r"-(\d+)")
  with os.scandir(path.parent) as entries:
    left = [e.path for e in entries if (m := pattern.fullmatch(e.name)) and not
            _running(int(m.group(1)))]
  for name in left:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(name)


def _running(pid: int) -> bool:
  """Whether process `pid` runs on this host (0 or ours: yes)."""
  if pid in (0, os.getpid()):
    return True
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # (another user's process)
    return True
  return True


@contextlib.contextmanager
def text_file(path: str | Path) -> Iterator[TextIO]:
  """A text file (UTF-8) to write `path` through: it becomes `path` whole when the block ends
  without an error, else `path` stays as it was (`replacing`)."""
  with replacing(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
    yield f


def write_text(path: str | Path, text: str, encoding: str = "utf-8"):
  with replacing(path) as tmp:
    tmp.write_text(text, encoding=encoding)


def write_json(path: str | Path, value, **dump_args):
  write_text(path, json.dumps(value, **dump_args) + "\n")


def _exchange(a: Path, b: Path) -> bool:
  """Swaps the two paths in one step (Linux renameat2); False where the call is missing."""
  libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
  renameat2 = getattr(libc, "renameat2", None)
  if renameat2 is None:
    return False
  if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
    return True
  errno = ctypes.get_errno()
  if errno in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: no exchange on this filesystem
    return False
  raise OSError(errno, os.strerror(errno), str(b))


def replace_folder(new: Path, old: Path, between=lambda: None):
  """Puts the complete folder `new` at `old`'s path, replacing the folder there (if any) in one
  atomic exchange, then removes the replaced one. `between`: called after the exchange,
  before the removal (fault injection)."""
  if not old.exists():
    os.replace(new, old)
    return
  if _exchange(new, old):
    between()
    shutil.rmtree(new)
    return
  kept = old.with_name(f".{old.name}.replaced-{os.getpid()}")
  shutil.rmtree(kept, ignore_errors=True)  # (left by a run of this pid that was stopped)
  os.replace(old, kept)  # (a kill before the next rename leaves the old folder here, named)
  try:
    os.replace(new, old)
  except OSError:
    os.replace(kept, old)
    raise
  between()
  shutil.rmtree(kept)
