"""Config files and --config.KEY=VALUE overrides: every mistake in them is one ConfigError that
names the file and line, or the flag (with the closest known key)."""

import ml_collections
import pytest

from transformer_jax.config import files
from transformer_jax.configs import tiny
from transformer_jax.errors import ConfigError


def _write(tmp_path, text, name="cfg.py"):
  path = tmp_path / name
  path.write_text(text)
  return str(path)


def test_a_config_file_loads_with_its_imports():
  config = files.load_file("configs/tiny.py")  # (it builds on vaswani.py, on default.py)
  assert config.to_dict() == tiny.get_config().to_dict()


@pytest.mark.parametrize("text, message", [
    ("def get_config(:\n  pass\n", r"cfg\.py:1: (invalid syntax|'\(' was never closed)"),
    ("import ml_collections\nx = 1 / 0\n", r"cfg\.py:2: ZeroDivisionError: division by zero"),
    ("import ml_collections\nCONFIG = 1\n", r"cfg\.py defines no get_config\(\) function"),
    ("def get_config():\n  return {'a': 1}\n", r"get_config\(\) returned dict, expected an "
                                               r"ml_collections\.ConfigDict"),
    ("import ml_collections\ndef get_config():\n  c = ml_collections.ConfigDict()\n"
     "  c.lr = 1.0\n  c.lr = 'fast'\n  return c\n",
     r"cfg\.py:5: TypeError in get_config\(\): .*"),
])
def test_a_broken_config_file_is_named_with_its_line(tmp_path, text, message):
  with pytest.raises(ConfigError, match=message):
    files.load_file(_write(tmp_path, text))


def test_outside_a_checkout_a_shipped_config_is_found_by_its_checkout_path(tmp_path,
                                                                            monkeypatch):
  monkeypatch.chdir(tmp_path)  # (no configs/ here: the installed wheel's case)
  assert files.load_file("configs/tiny.py").to_dict() == tiny.get_config().to_dict()
  assert files.load_file("tiny.py").to_dict() == tiny.get_config().to_dict()
  assert "search_space" in files.load_file("configs/sweeps/tiny_lr_warmup.py")
  (tmp_path / "configs").mkdir()  # a file of the user's own takes precedence
  _write(tmp_path, "import ml_collections\ndef get_config():\n"
         "  return ml_collections.ConfigDict({'mine': 1})\n", "configs/tiny.py")
  assert files.load_file("configs/tiny.py").to_dict() == {"mine": 1}


def test_a_missing_config_file_is_named(tmp_path):
  with pytest.raises(ConfigError, match=r"configs/nope\.py: no such config file; the shipped "
                                        r"ones: configs/backtranslation\.py, .*configs/tiny\.py"):
    files.load_file("configs/nope.py")
  with pytest.raises(ConfigError, match=r"no such config file \(it is a folder\)"):
    files.load_file(str(tmp_path))


def test_overrides_are_parsed_by_the_type_of_the_value_they_replace():
  argv = ["prog", "--workdir=x", "--config.model.d_model=64", "--config.optimizer.b1=1",
          "--config.model.pre_layer_norm=false", "--config.model.scan_layers",
          "--config.parallelism.mesh_shape=(1,-1,1)", "--config.data.source_lang=en"]
  rest, overrides = files.split_overrides(argv, ["config"])
  assert rest == ["prog", "--workdir=x"]
  config = files.apply_overrides(tiny.get_config(), overrides["config"], "config")
  assert config.model.d_model == 64 and config.optimizer.b1 == 1.0
  assert config.model.pre_layer_norm is False and config.model.scan_layers is True
  assert config.parallelism.mesh_shape == (1, -1, 1) and config.data.source_lang == "en"
  assert tiny.get_config().model.d_model == 32  # the loaded config itself is not changed


@pytest.mark.parametrize("override, message", [
    ("--config.model.num_layerz=2", r"--config\.model\.num_layerz: config\.model has no key "
                                    r"'num_layerz' \(did you mean scan_layers, "
                                    r"num_encoder_layers or num_decoder_layers\?\)"),
    ("--config.model.zzz=2", r"config\.model has no key 'zzz'; known keys: "
                             r"activation_dtype, attention_dropout_rate, attention_impl, "),
    ("--config.model.num_head=2", r"config\.model has no key 'num_head' \(did you mean "
                                  r"num_heads or num_kv_heads\?\)"),
    ("--config.modle.d_model=2", r"config has no key 'modle' \(did you mean model\?\)"),
    ("--config.model.d_model=wide", r"--config\.model\.d_model: 'wide' is not a valid int"),
    ("--config.model.pre_layer_norm=maybe", r"'maybe' is not a valid bool"),
    ("--config.model=3", r"--config\.model is a section; override its keys"),
    ("--config.model.d_model", r"--config\.model\.d_model needs a value"),
    ("--config.seed.x=1", r"config\.seed is a value, not a section"),
])
def test_a_bad_override_is_named(override, message):
  with pytest.raises(ConfigError, match=message):
    files.apply_overrides(tiny.get_config(), [override], "config")


def test_find_field_walks_sections():
  config = ml_collections.ConfigDict({"a": {"b": 1}})
  parent, key = files.find_field(config, "a.b", "where")
  assert parent[key] == 1
