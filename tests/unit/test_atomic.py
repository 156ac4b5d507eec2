"""Atomic writes (transformer_jax/atomic.py): a failure or a kill at any point leaves the old
file or folder or the new one at its path, never a part. Faults injected in-process."""

import errno
import os
import socket
import subprocess

import pytest

from transformer_jax import atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
  path = tmp_path / "config.json"
  atomic.write_json(path, {"v": 1})
  with pytest.raises(RuntimeError):
    with atomic.replacing(path) as tmp:
      tmp.write_text('{"v": 2, "half')
      raise RuntimeError("killed mid-write")
  assert path.read_text() == '{"v": 1}\n' and [p.name for p in tmp_path.iterdir()] == [path.name]
  atomic.write_text(tmp_path / "new" / "file.txt", "made with its folder")
  assert (tmp_path / "new" / "file.txt").read_text() == "made with its folder"


def _folder(path, version):
  path.mkdir()
  (path / "model.bin").write_text(version)
  (path / "export.json").write_text(version)
  return path


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two renames"])
def test_replacing_a_folder_keeps_a_complete_one_at_its_path_throughout(tmp_path, monkeypatch,
                                                                        exchange):
  if not exchange:
    monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
  out = _folder(tmp_path / "export", "old")
  new = _folder(tmp_path / ".export.partial", "new")
  seen = []

  def at_the_kill_point():  # after the swap, before the old folder is removed
    seen.append(sorted(p.read_text() for p in out.iterdir()))
    raise KeyboardInterrupt  # (a kill here: the old one is left beside, the new one in place)

  with pytest.raises(KeyboardInterrupt):
    atomic.replace_folder(new, out, between=at_the_kill_point)
  assert seen == [["new", "new"]] and sorted(p.read_text() for p in out.iterdir()) == ["new"] * 2
  # a clean replacement removes the old one
  atomic.replace_folder(_folder(tmp_path / ".again", "newer"), out)
  assert (out / "model.bin").read_text() == "newer"
  assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".")] == ["export"]


def test_a_failed_second_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
  monkeypatch.setattr(atomic, "_exchange", lambda a, b: False)
  out = _folder(tmp_path / "export", "old")
  missing = tmp_path / "not-written"  # the new folder's rename fails
  with pytest.raises(OSError):
    atomic.replace_folder(missing, out)
  assert (out / "model.bin").read_text() == "old"



def test_a_write_removes_what_this_hosts_killed_writers_left_and_nothing_else(tmp_path):
  """A writer SIGKILLed mid-write leaves its temporary file; the next write of that file
  removes it, not those of a process still running or of another host, nor another file's."""
  ended = subprocess.Popen(["true"])
  ended.wait()
  host = socket.gethostname()
  killed = tmp_path / f".out.en.tmp-{host}-{ended.pid}"
  kept = [tmp_path / f".out.en.tmp-{host}-{os.getppid()}",
          tmp_path / f".out.en.tmp-elsewhere-{ended.pid}",
          tmp_path / f".other.en.tmp-{host}-{ended.pid}"]
  for path in (killed, *kept):
    path.write_text("half a translation")
  atomic.write_text(tmp_path / "out.en", "whole")
  assert sorted(tmp_path.iterdir()) == sorted([tmp_path / "out.en", *kept])


def test_an_os_error_of_a_write_names_the_file_and_what_is_kept(tmp_path, monkeypatch):
  path = tmp_path / "out.en"
  path.write_text("old")

  def failing_disk(fd):
    raise OSError(errno.EIO, "Input/output error")
  monkeypatch.setattr(os, "fsync", failing_disk)
  with pytest.raises(OSError) as caught:
    atomic.write_text(path, "new")
  assert (caught.value.filename, caught.value.kept) == (str(path),
                                                        "the one there is kept as it was")
  assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.en"]
  monkeypatch.undo()
  (tmp_path / "folder").mkdir()  # (e.g. translate --output=a folder)
  with pytest.raises(IsADirectoryError) as caught:
    atomic.write_text(tmp_path / "folder", "new")
  assert caught.value.filename == str(tmp_path / "folder")
  with pytest.raises(OSError) as caught:  # (a file where its folder would be)
    atomic.write_text(path / "x", "new")
  assert (caught.value.filename, caught.value.kept) == (str(path / "x"), "no part of it is left")
  with pytest.raises(OSError) as caught:  # (another file read while writing: not this write's)
    with atomic.replacing(tmp_path / "copy.en"):
      (tmp_path / "missing.en").read_text()
  assert caught.value.filename == str(tmp_path / "missing.en")
  assert not hasattr(caught.value, "kept")
