"""The errors a user causes and can fix. Each message is one line that says what is wrong and
where (the file, line, key or flag); the command-line runner prints it without a traceback."""


class Error(Exception):
  """Base of the errors below."""


class ConfigError(Error, ValueError):
  """A config file or key is missing, unknown, of the wrong type or contradictory."""


class UsageError(Error, ValueError):
  """A command-line flag or argument is missing or malformed."""


class DataError(Error, ValueError):
  """A data file is missing or malformed, or a corpus has nothing to train on."""


class CheckpointError(Error, ValueError):
  """A workdir, checkpoint or checkpoint selection is missing or unusable."""


class NonFiniteError(Error, FloatingPointError):
  """A non-finite loss or gradient under config.nonfinite_updates='stop'."""


class Interrupted(Error):
  """A run stopped by a signal (SIGTERM, Ctrl-C) before it finished; rerunning continues it."""


class WorkdirBusy(Error):
  """Another process is writing the workdir (it holds the workdir's lock)."""
