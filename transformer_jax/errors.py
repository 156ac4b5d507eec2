"""The errors a user causes and can fix. Each message is one line that says what is wrong and
where (the file, line, key or flag); the command-line runner prints it without a traceback."""

import errno
import os
import re


class Error(Exception):
  """Base of the errors below."""


class ConfigError(Error, ValueError):
  """A config file or key is missing, unknown, of the wrong type or contradictory."""


class UsageError(Error, ValueError):
  """A command-line flag or argument is missing or malformed."""


class DataError(Error, ValueError):
  """A data file is missing or malformed, or a corpus has nothing to train on."""


class TokenizerDamaged(DataError):
  """A tokenizer file that SentencePiece cannot read (truncated, or another kind of file)."""


class CheckpointError(Error, ValueError):
  """A workdir, checkpoint or checkpoint selection is missing or unusable."""


class NonFiniteError(Error, FloatingPointError):
  """A non-finite loss or gradient under config.nonfinite_updates='stop'."""


class Interrupted(Error):
  """A run stopped by a signal (SIGTERM, Ctrl-C) before it finished; rerunning continues it."""


class WorkdirBusy(Error):
  """Another process is writing the workdir (it holds the workdir's lock)."""


class FilesystemError(Error):
  """A file or folder cannot be written: read-only or full filesystem, missing permission."""


# errno values that mean "this filesystem will not take the write", whoever asked for it.
WRITE_ERRNOS = frozenset({errno.EACCES, errno.ENOSPC, errno.EROFS, errno.EDQUOT})
# What a failed write keeps, unless the writer says more: a file is replaced whole or not at
# all, and a failed checkpoint save leaves the earlier ones.
KEPT = "everything saved before it is kept"


def on_write(error: OSError, path, kept: str = KEPT) -> OSError:
  """`error`, raised writing `path` (whatever its errno), marked so: the runner's line then
  names `path` and says what is `kept`."""
  error.filename, error.filename2 = str(path), None
  error.kept = kept
  return error


def filesystem_cause(error: BaseException) -> OSError | None:
  """The OSError of a write behind `error` (itself, or what caused it, as libraries such as
  Orbax wrap it), or None: one of WRITE_ERRNOS, one marked by `on_write`, or any in an Orbax
  checkpoint being written. TensorStore (Orbax's writer) reports the OS error only in its
  message text (`... local file "PATH" ... [os_error_code='28']`): that becomes an OSError too
  (of any errno when the text says it was writing), and the path of a file without one is
  taken from such a message."""
  seen, found, path = set(), None, None
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if found is None and isinstance(error, OSError) and (
        error.errno in WRITE_ERRNOS or hasattr(error, "kept")
        or ".orbax-checkpoint-tmp" in str(error.filename)):
      found = error
    code = re.search(r"os_error_code='(\d+)'", str(error))
    if code and (int(code.group(1)) in WRITE_ERRNOS or re.search(r"\b[Ww]rit(e|ing)\b",
                                                                   str(error))):
      where = re.search(r'local file "(/[^"]+)"', str(error))
      path = path or (where and _checkpoint_of(where.group(1)))
      found = found or OSError(int(code.group(1)), os.strerror(int(code.group(1))), path)
    error = error.__cause__ or error.__context__
  if found is not None and found.filename is None and path:
    found = OSError(found.errno, found.strerror, path)
  elif found is not None and ".orbax-checkpoint-tmp" in str(found.filename):
    found = OSError(found.errno, found.strerror, _checkpoint_of(str(found.filename)))
  return found


def os_error_of(error: BaseException) -> OSError | None:
  """The OSError naming a file behind `error` (itself, or what caused it), or None: one that
  no writer marked (a folder where a file is appended to, a device failing a read) is still a
  file the user can look at."""
  seen = set()
  while error is not None and id(error) not in seen:
    seen.add(id(error))
    if isinstance(error, OSError) and error.filename is not None and error.strerror:
      return error
    error = error.__cause__ or error.__context__
  return None


def _checkpoint_of(path: str) -> str:
  """An Orbax temporary path (`<dir>/16.orbax-checkpoint-tmp/...`) as the checkpoint's own."""
  return path.split(".orbax-checkpoint-tmp")[0].rstrip("/")
