"""Every tool, run in-process: `--help` lists its own flags, and each mistake in the command
line or the config ends in one line and an exit status, with nothing saved."""

import errno
import importlib

import pytest

from tests import helpers
from transformer_jax import atomic
from transformer_jax.cli import runner, train

TOOLS = {"train": ["--config", "--workdir", "--coordinator_address", "--jax_platforms"],
         "evaluate": ["--workdir", "--checkpoint", "--source_file", "--decode", "--lowercase"],
         "translate": ["--workdir", "--input", "--output", "--interactive", "--decode"],
         "average": ["--workdir", "--checkpoint", "--output"],
         "attention_maps": ["--workdir", "--sentence", "--translation", "--output_dir"],
         "prepare_data": ["--config", "--workdir"],
         "split_corpus": ["--pairs", "--columns", "--group_by", "--test", "--out"],
         "sweep": ["--config", "--sweep", "--workdir", "--storage", "--heartbeat_grace"]}


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_help_lists_the_tools_own_flags(tool):
  module = importlib.import_module(f"transformer_jax.cli.{tool}")
  status, out, _ = helpers.run_tool(module.main, "--help")
  assert status == 0
  assert out.startswith(module.__doc__.strip().splitlines()[0])
  for flag in TOOLS[tool] + ["--verbosity"]:
    assert f"{flag}:" in out or f"--[no]{flag[2:]}:" in out, (tool, flag)
  assert "--helpfull" not in out and "--flagfile" not in out  # only the tool's own flags


def _train(tmp_path, *args):
  status, _, err = helpers.run_tool(train.main, "--config=configs/tiny.py",
                                    f"--workdir={tmp_path / 'run'}", *args)
  assert not (tmp_path / "run" / "checkpoints").exists()
  assert not (tmp_path / "run" / "config.json").exists()
  return status, helpers.one_line_error(err)


@pytest.mark.parametrize("override, message", [
    ("--config.model.num_layerz=2", "config error: --config.model.num_layerz: config.model has "
                                    "no key 'num_layerz' (did you mean scan_layers, "
                                    "num_encoder_layers or num_decoder_layers?)"),
    ("--config.model.num_head=2", "config error: --config.model.num_head: config.model has no "
                                  "key 'num_head' (did you mean num_heads or num_kv_heads?)"),
    ("--config.model.d_model=wide", "config error: --config.model.d_model: 'wide' is not a "
                                    "valid int"),
    # (before the tokenizer and the compile, and never written into config.json)
    ("--config.time_budget_minutes=nan", "config error: config.time_budget_minutes=nan is not "
                                         "a finite number"),
    ("--config.optimizer.learning_rate=inf", "config error: config.optimizer.learning_rate=inf "
                                             "is not a finite number"),
])
def test_a_bad_override_is_one_line(tmp_path, override, message):
  status, line = _train(tmp_path, override)
  assert status == 2 and line.startswith(message), line


@pytest.mark.parametrize("text, message", [
    (None, "config error: {path}: no such config file"),
    ("def get_config(:\n", "config error: {path}:1: "),
    ("x = 1\n", "config error: {path} defines no get_config() function"),
])
def test_a_bad_config_file_is_one_line(tmp_path, text, message):
  path = tmp_path / "cfg.py"
  if text is not None:
    path.write_text(text)
  status, _, err = helpers.run_tool(train.main, f"--config={path}", f"--workdir={tmp_path}")
  assert status == 2 and helpers.one_line_error(err).startswith(message.format(path=path))


@pytest.mark.parametrize("args, message", [
    ((), "train: --config is required; --workdir is required"),
    (("--config=configs/tiny.py", "--workdri=x"), "train: Unknown command line flag 'workdri'"),
    (("--config=configs/tiny.py", "--workdir=x", "extra"), "train: unexpected arguments: extra"),
    (("--config=configs/tiny.py", "--workdir=x", "--wait_for_workdir=nan"),
     "train: --wait_for_workdir=nan: not a finite number"),
])
def test_a_bad_command_line_is_one_line(args, message):
  status, _, err = helpers.run_tool(train.main, *args)
  line = helpers.one_line_error(err)
  assert status == 2 and line.startswith(message) and "(--help lists the flags)" in line, line


@pytest.mark.parametrize("override, message", [
    ("--config.parallelism.mesh_shape=(3,1,1)", "does not fit the 1"),
    ("--config.data.batch_size=15", "batch_size=15 is not divisible by"),  # 2 micro-batches
    ("--config.model.vocab_size=20", "vocab_size=20 cannot hold the training data's characters"),
    ("--config.nonfinite_updates=ignore", "nonfinite_updates='ignore' must be 'stop' or 'skip'"),
])
def test_contradictory_settings_stop_before_anything_is_saved(tmp_path, tfds_cache, override,
                                                              message):
  status, line = _train(tmp_path, f"--config.data.cache_dir={tfds_cache}",
                        "--config.num_micro_batches=2", override)
  assert status == 2 and line.startswith("config error: ") and message in line, line


def test_every_tool_enables_the_cache_before_its_body_runs(monkeypatch):
  calls = []
  monkeypatch.setattr(runner, "enable_compilation_cache", lambda: calls.append("cache"))
  status = runner.run("tool", "A tool.", lambda fv: None, lambda args: calls.append("body"),
                      ["tool"])
  assert status == 0 and calls == ["cache", "body"]


def test_a_filesystem_refusing_a_write_is_one_line_whatever_wraps_it(capsys):
  def body(args):  # (as Orbax reports a full disk: its own error, the OSError as the cause)
    try:
      raise OSError(errno.ENOSPC, "No space left on device", "/runs/x/checkpoints/8")
    except OSError as e:
      raise ValueError("commit failed") from e
  assert runner.run("train", "A tool.", lambda fv: None, body, ["train"]) == runner.EXIT_ERROR
  err = capsys.readouterr().err.strip()
  assert err == ("train: cannot write /runs/x/checkpoints/8: No space left on device "
                 "(everything saved before it is kept)")

  def tensorstore(args):  # (Orbax's writer on a full disk, mid-save: the error only as text)
    raise ValueError('RESOURCE_EXHAUSTED: Error writing "params.x/0" in OCDBT database at '
                     'local file "/runs/x/checkpoints/16.orbax-checkpoint-tmp/state.orbax-'
                     'checkpoint-tmp/ocdbt.process_0/": Failed to write 14897 bytes to file '
                     "10: No space left on device [os_error_code='28']")
  assert runner.run("train", "A tool.", lambda fv: None, tensorstore, ["train"]) == 1
  assert capsys.readouterr().err.strip() == (
      "train: cannot write /runs/x/checkpoints/16: No space left on device (everything saved "
      "before it is kept)")

  def other(args):
    raise ValueError("a bug, not the filesystem")
  with pytest.raises(ValueError, match="a bug"):  # (everything else keeps its traceback)
    runner.run("train", "A tool.", lambda fv: None, other, ["train"])



def test_any_os_error_of_a_write_is_one_line_naming_the_file_and_what_is_kept(tmp_path, capsys):
  (tmp_path / "out.en").mkdir()

  def translate_into_a_folder(args):
    atomic.write_text(tmp_path / "out.en", "a translation")
  assert runner.run("translate", "A tool.", lambda fv: None, translate_into_a_folder,
                    ["translate"]) == runner.EXIT_ERROR
  assert capsys.readouterr().err.strip() == (
      f"translate: cannot write {tmp_path / 'out.en'}: Is a directory (the one there is kept as "
      "it was)")

  def append_to_a_folder(args):  # (a write no writer marks: metrics.jsonl, say)
    with open(tmp_path / "out.en", "a") as f:
      f.write("a line")
  assert runner.run("train", "A tool.", lambda fv: None, append_to_a_folder,
                    ["train"]) == runner.EXIT_ERROR
  assert capsys.readouterr().err.strip() == (
      f"train: {tmp_path / 'out.en'}: Is a directory (everything saved before it is kept)")

  def failing_disk_under_orbax(args):  # (a checkpoint's temporary folder, wrapped)
    try:
      raise OSError(errno.EIO, "Input/output error",
                    "/runs/x/checkpoints/8.orbax-checkpoint-tmp/state")
    except OSError as e:
      raise ValueError("commit failed") from e
  assert runner.run("train", "A tool.", lambda fv: None, failing_disk_under_orbax,
                    ["train"]) == 1
  assert capsys.readouterr().err.strip() == (
      "train: cannot write /runs/x/checkpoints/8: Input/output error (everything saved before "
      "it is kept)")

  def tensorstore(args):  # (Orbax's writer, the error only as text)
    raise ValueError('UNKNOWN: Error writing "params.x/0" in OCDBT database at local file '
                     '"/runs/x/checkpoints/16.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/'
                     "ocdbt.process_0/\": Failed to write 14897 bytes to file 10: Input/output "
                     "error [os_error_code='5']")
  assert runner.run("train", "A tool.", lambda fv: None, tensorstore, ["train"]) == 1
  assert capsys.readouterr().err.strip() == (
      "train: cannot write /runs/x/checkpoints/16: Input/output error (everything saved "
      "before it is kept)")

  def reading(args):  # (a read: one line too, not said to be a write)
    raise OSError(errno.EIO, "Input/output error", "/data/train.de")
  assert runner.run("train", "A tool.", lambda fv: None, reading, ["train"]) == 1
  assert capsys.readouterr().err.strip() == (
      "train: /data/train.de: Input/output error (everything saved before it is kept)")

  def a_bug(args):  # (an error that names no file keeps its traceback)
    raise OSError(errno.EIO, "Input/output error")
  with pytest.raises(OSError, match="Input/output error"):
    runner.run("train", "A tool.", lambda fv: None, a_bug, ["train"])
