"""Reading UTF-8 text line by line: one reader for corpus files, test sets and standard input,
naming the input and line of an invalid byte."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from transformer_jax.errors import DataError


def iter_lines(stream: BinaryIO, name: str, first_line: int = 1) -> Iterator[str]:
  """The stripped lines of a binary stream, one at a time (standard input is read as it comes).
  Invalid UTF-8 is a DataError naming `name` and the line (counted from `first_line`: the
  number of the stream's first line in its file)."""
  for number, raw in enumerate(stream, start=first_line):
    try:
      yield raw.decode("utf-8").strip()
    except UnicodeDecodeError as e:
      raise DataError(f"{name}:{number}: not valid UTF-8 ({e.reason} at byte {e.start})"
                      ) from None


def read_lines(path: str | Path) -> Iterator[str]:
  """The stripped lines of a UTF-8 text file, gzipped (`.gz`) or plain, streamed."""
  path = Path(path)
  if not path.is_file():
    raise DataError(f"file {path} does not exist")
  with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
    yield from iter_lines(f, str(path))
