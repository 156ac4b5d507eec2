"""Writing files and folders so that a reader, or a crash at any point, sees the old version or
the new one, never a part: every file a run or a tool writes goes through here.

A file is written to a temporary name beside it (same folder, so the same filesystem), flushed
to disk, then renamed over the old one (`os.replace`, atomic on POSIX filesystems). A folder
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
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@contextlib.contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
  """Yields a temporary path to write `path`'s new content to; on leaving the block without
  an error it becomes `path` (flushed first), on an error it is removed and `path` is left
  as it was."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
  try:
    yield tmp
    with open(tmp, "rb+") as f:
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    with contextlib.suppress(FileNotFoundError):
      tmp.unlink()


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
