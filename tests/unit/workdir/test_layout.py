"""What a workdir holds: a folder that cannot be written is found before long work."""

import errno

import pytest

from tests import helpers
from transformer_jax.errors import CheckpointError, FilesystemError
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


def test_a_population_s_workdir_is_refused_by_the_tools_naming_its_members(tmp_path):
  config = helpers.tiny_config(**{"population.seeds": 3})
  layout.save_config(config.to_dict(), tmp_path)
  with pytest.raises(CheckpointError, match=rf"^{tmp_path} is a population of 3 members: give "
                                            rf"one member's workdir, {tmp_path}/members/<i> "
                                            r"\(0 to 2\)$"):
    layout.load_config(tmp_path)
  member = layout.member_dir(tmp_path, 1)
  layout.save_config(helpers.tiny_config().to_dict(), member)
  assert layout.load_config(member).population.size == 0
  assert layout.members(tmp_path) == [member]


def test_a_result_replaces_one_recorded_before_a_decoding_key_existed(tmp_path):
  decode = {"beam_size": 4, "beam_impl": "auto"}
  older = {"label": "step_3", "data": "test", "decode": {"beam_size": 4}, "bleu": 1.0}
  layout.write_results(tmp_path, [older])
  layout.write_results(tmp_path, [{**older, "decode": decode, "bleu": 2.0}])
  layout.write_results(tmp_path, [{**older, "decode": {**decode, "beam_size": 5}}])
  assert [r["bleu"] for r in layout.read_results(tmp_path)] == [2.0, 1.0]
