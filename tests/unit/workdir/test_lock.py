"""One writer per workdir: a second holder is refused naming the first, a dead holder's lock
is taken over, a clean end names no holder."""

import json
import logging
import os

import pytest

from tests import helpers
from transformer_jax.cli import evaluate, export, translate_corpus
from transformer_jax.errors import WorkdirBusy
from transformer_jax.workdir import lock


def test_a_second_writer_is_refused_naming_the_first(tmp_path):
  with lock.hold(tmp_path / "run", "train"):
    holder = json.loads((tmp_path / "run" / lock.LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["command"] == "train"
    # (flock belongs to an open file: a second open, even in this process, conflicts)
    with pytest.raises(WorkdirBusy, match=rf"workdir .*run is in use by pid {os.getpid()} on "
                                          r".* \(train, since .*\); wait for it"):
      with lock.hold(tmp_path / "run", "evaluate", wait_seconds=0.6):
        pass
  assert (tmp_path / "run" / lock.LOCK_FILE).read_text() == ""  # released, no holder named
  with lock.hold(tmp_path / "run", "evaluate"):  # and free again
    pass


def test_the_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
  (tmp_path / lock.LOCK_FILE).write_text(json.dumps(  # as a SIGKILLed run leaves it
      {"pid": 999999, "host": "elsewhere", "command": "train", "since": 0}))
  with caplog.at_level(logging.INFO, logger="transformer_jax"):
    with lock.hold(tmp_path, "train"):
      assert json.loads((tmp_path / lock.LOCK_FILE).read_text())["pid"] == os.getpid()
  assert "lock of pid 999999 on elsewhere (train" in caplog.text and "taken over" in caplog.text


@pytest.mark.parametrize("tool", ["export", "translate_corpus"])
def test_export_and_translate_corpus_hold_their_output_folders_lock(tool, tmp_path):
  """Both refuse, in one line, an output folder another process is writing (the lock is
  taken before anything is read or written)."""
  out = tmp_path / "out"
  held = dict(export=(out, out.with_name(".out.lock")), translate_corpus=(out, None))[tool]
  args = [f"--workdir={tmp_path / 'run'}", f"--out={out}"]
  if tool == "translate_corpus":
    args.append(f"--input={tmp_path / 'mono.en'}")
  main = dict(export=export.main, translate_corpus=translate_corpus.main)[tool]
  with lock.hold(held[0], "another " + tool, lock_path=held[1]):
    status, _, err = helpers.run_tool(main, *args)
  assert status == 1 and "is in use by pid" in helpers.one_line_error(err), err
  assert not out.exists() or tool == "translate_corpus"


def test_evaluate_refused_by_a_running_train_names_the_way_to_evaluate_beside_it(tmp_path):
  with lock.hold(tmp_path / "run", "train"):
    status, _, err = helpers.run_tool(evaluate.main, f"--workdir={tmp_path / 'run'}")
  message = helpers.one_line_error(err)
  assert status == 1 and "is in use by pid" in message and "--output_dir=DIR" in message, err
