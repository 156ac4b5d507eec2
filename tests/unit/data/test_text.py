"""The one line reader: plain and gzipped files and streams, and the line of any invalid byte."""

import gzip
import io

import pytest

from transformer_jax.data.text import iter_lines, read_lines
from transformer_jax.errors import DataError


def test_plain_gzipped_and_streamed_text_read_the_same_lines(tmp_path):
  text = "eins \nzwei\r\n\n drei"
  (tmp_path / "a.txt").write_text(text, encoding="utf-8")
  (tmp_path / "a.txt.gz").write_bytes(gzip.compress(text.encode()))
  expected = ["eins", "zwei", "", "drei"]
  assert list(read_lines(tmp_path / "a.txt")) == expected
  assert list(read_lines(tmp_path / "a.txt.gz")) == expected
  assert list(iter_lines(io.BytesIO(text.encode()), "<stdin>")) == expected


def test_invalid_utf8_and_missing_files_are_named(tmp_path):
  with pytest.raises(DataError, match=r"<stdin>:2: not valid UTF-8 \(invalid start byte at "
                                      r"byte 7\)"):
    list(iter_lines(io.BytesIO(b"gut\nkaputt \xff\n"), "<stdin>"))
  with pytest.raises(DataError, match=r"file .*nowhere\.txt does not exist"):
    list(read_lines(tmp_path / "nowhere.txt"))
