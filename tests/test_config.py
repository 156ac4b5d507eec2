"""Configs fail fast with messages that name the offending key."""

import subprocess
import sys

import ml_collections
import pytest

from configs import default, tatoeba_deen, tiny, wmt_base, wmt_big
from transformer_jax import config as config_lib
from tests.conftest import ROOT


@pytest.mark.parametrize("get_config", [default.get_config, tiny.get_config, wmt_base.get_config,
                                        wmt_big.get_config, tatoeba_deen.get_config])
def test_shipped_configs_build(get_config):
  cfg = config_lib.from_config_dict(get_config())
  assert cfg.model.d_model % cfg.model.num_heads == 0


def test_unknown_key_in_a_section_is_named():
  c = tiny.get_config()
  c.model.num_layer = 3  # misspelt
  with pytest.raises(config_lib.ConfigError, match=r"unknown key\(s\) config\.model\.num_layer"):
    config_lib.from_config_dict(c)


def test_unknown_run_level_key_is_named():
  c = tiny.get_config()
  c.num_train_step = 3
  with pytest.raises(config_lib.ConfigError, match=r"config\.num_train_step"):
    config_lib.from_config_dict(c)


def test_wrong_type_is_named():
  values = tiny.get_config().to_dict()
  values["model"]["dropout_rate"] = "high"  # as a config file could write it
  c = ml_collections.ConfigDict(values)
  with pytest.raises(config_lib.ConfigError, match=r"config\.model\.dropout_rate='high' .*float"):
    config_lib.from_config_dict(c)


def test_d_model_not_divisible_by_num_heads_is_named():
  c = tiny.get_config()
  c.model.num_heads = 5
  with pytest.raises(config_lib.ConfigError, match=r"d_model=32 is not divisible .*num_heads=5"):
    config_lib.from_config_dict(c)


def test_contradictory_lengths_are_rejected():
  c = tiny.get_config()
  c.model.max_len = 16
  with pytest.raises(config_lib.ConfigError, match=r"config\.model\.max_len=16"):
    config_lib.from_config_dict(c)


def _train(*args):
  return subprocess.run([sys.executable, "train.py", "--config=configs/tiny.py", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_command_line_override_of_unknown_key_fails(tmp_path):
  r = _train(f"--workdir={tmp_path}", "--config.model.num_layerz=2")
  assert r.returncode != 0
  assert "num_layerz" in r.stderr
  assert not (tmp_path / "checkpoints").exists()


def test_command_line_override_of_wrong_type_fails(tmp_path):
  r = _train(f"--workdir={tmp_path}", "--config.model.d_model=wide")
  assert r.returncode != 0
  assert "d_model" in r.stderr and "wide" in r.stderr


@pytest.mark.parametrize("override, message", [
    ("--config.parallelism.mesh_shape=(3,1,1)", "does not fit the 1"),
    ("--config.data.batch_size=15", "batch_size=15 is not divisible by"),  # 2 micro-batches
    ("--config.model.vocab_size=20", "vocab_size=20 cannot hold the training data's characters"),
    ("--config.nonfinite_updates=ignore", "nonfinite_updates='ignore' must be 'stop' or 'skip'"),
])
def test_contradictory_settings_stop_before_anything_is_saved(tmp_path, override, message):
  r = _train(f"--workdir={tmp_path / 'run'}", f"--config.data.cache_dir={tmp_path / 'tfds'}",
             "--config.num_micro_batches=2", override)
  assert r.returncode != 0 and "config error: " in r.stderr and message in r.stderr, \
      r.stderr[-2000:]
  assert "Traceback" not in r.stderr
  assert not (tmp_path / "run" / "checkpoints").exists()
  assert not (tmp_path / "run" / "config.json").exists()
