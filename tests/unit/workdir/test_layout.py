"""What a workdir holds: a folder that cannot be written is found before long work."""

import errno

import pytest

from transformer_jax.errors import FilesystemError
from transformer_jax.workdir import layout


def test_a_read_only_workdir_stops_before_the_work(tmp_path, monkeypatch):
  real_open = open

  def read_only(path, *args, **kwargs):
    if ".write-check-" in str(path):
      raise OSError(errno.EROFS, "Read-only file system", str(path))
    return real_open(path, *args, **kwargs)
  monkeypatch.setattr("builtins.open", read_only)
  with pytest.raises(FilesystemError, match=rf"cannot write {tmp_path}: Read-only file system"):
    layout.check_writable(tmp_path)
