"""ConfigDicts and key=value text become typed sections, failing fast with the key named."""

import ml_collections
import pytest

from tests import helpers
from transformer_jax.config import parse as config_lib
from transformer_jax.configs import tiny
from transformer_jax.errors import ConfigError


def test_unknown_key_in_a_section_is_named_with_the_closest_known_one():
  c = tiny.get_config()
  c.model.num_head = 3  # misspelt
  with pytest.raises(ConfigError, match=r"unknown key config\.model\.num_head \(did you mean "
                                        r"num_heads or num_kv_heads\?\)"):
    config_lib.from_config_dict(c)
  c = tiny.get_config()
  c.model.zzz = 3  # nothing close: the known keys are listed
  with pytest.raises(ConfigError, match=r"unknown key config\.model\.zzz; known keys: .*d_ff"):
    config_lib.from_config_dict(c)


def test_unknown_run_level_key_is_named():
  c = tiny.get_config()
  c.num_train_step = 3
  with pytest.raises(ConfigError, match=r"config\.num_train_step \(did you mean "
                                        r"num_train_steps\?\)"):
    config_lib.from_config_dict(c)


def test_wrong_type_is_named():
  values = tiny.get_config().to_dict()
  values["model"]["dropout_rate"] = "high"  # as a config file could write it
  c = ml_collections.ConfigDict(values)
  with pytest.raises(ConfigError, match=r"config\.model\.dropout_rate='high' .*float"):
    config_lib.from_config_dict(c)


def test_missing_key_is_named():
  values = tiny.get_config().to_dict()
  del values["optimizer"]["b2"], values["seed"]
  with pytest.raises(ConfigError, match=r"missing key\(s\) config\.optimizer\.b2"):
    config_lib.from_config_dict(ml_collections.ConfigDict(values))
  del values["optimizer"]
  with pytest.raises(ConfigError, match=r"no section config\.optimizer"):
    config_lib.from_config_dict(ml_collections.ConfigDict(values))


@pytest.mark.parametrize("text, kind, value", [
    ("5", int, 5), ("1e-3", float, 1e-3), ("3", float, 3.0), ("true", bool, True),
    ("0", bool, False), ("(-1, 8, 1)", tuple[int, ...], (-1, 8, 1)), ("de", str, "de")])
def test_values_are_parsed_by_the_fields_type(text, kind, value):
  parsed = config_lib.parse_value(text, kind, "--x")
  assert parsed == value and type(parsed) is type(value)


def test_key_value_overrides_of_a_section():
  decode = helpers.section("decode")
  changed = config_lib.replace_from_text(decode, ["beam_size=5", "greedy=false",
                                                  "length_penalty=1"], "decode")
  assert (changed.beam_size, changed.greedy, changed.length_penalty) == (5, False, 1.0)
  with pytest.raises(ConfigError, match=r"--decode='beam=5': unknown key 'beam' \(did you "
                                        r"mean beam_size or beam_impl\?\)"):
    config_lib.replace_from_text(decode, ["beam=5"], "decode")
  with pytest.raises(ConfigError, match=r"'wide' is not a valid int"):
    config_lib.replace_from_text(decode, ["beam_size=wide"], "decode")
  with pytest.raises(ConfigError, match="expected key=value"):
    config_lib.replace_from_text(decode, ["beam_size"], "decode")
  with pytest.raises(ConfigError, match=r"nbest=5 must be in \[1, beam_size=2\]"):
    config_lib.replace_from_text(decode, ["nbest=5"], "decode")  # the section's own checks


def _float_keys(values: dict, prefix: str = "") -> list[str]:
  """The dotted keys of every float of a config's values, nested sections included."""
  keys = []
  for key, value in values.items():
    if isinstance(value, dict):
      keys += _float_keys(value, f"{prefix}{key}.")
    elif isinstance(value, float):
      keys.append(prefix + key)
  return keys


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_every_float_of_every_section_must_be_finite(bad):
  c = tiny.get_config()
  c.data.corpora = {"extra": {"weight": 1.0, "data_dir": "elsewhere"}}  # (a mixture's floats too)
  c.data.pretokenize = True
  keys = _float_keys(c.to_dict())
  assert {"optimizer.learning_rate", "decode.length_penalty", "decode.temperature",
          "time_budget_minutes", "data.corpora.extra.weight", "data.cleaning.max_length_ratio",
          "data.subword_sampling.alpha", "model.norm_epsilon"} <= set(keys)
  for key in keys:
    values = c.to_dict()
    helpers.with_overrides(values, {key: bad})
    with pytest.raises(ConfigError, match=rf"^config\.{key}={bad!r} is not a finite number$"):
      config_lib.from_config_dict(ml_collections.ConfigDict(values))
  values = tiny.get_config().to_dict()
  values["population"]["learning_rate"] = (1e-3, bad)  # (a member's value)
  with pytest.raises(ConfigError, match=r"^config\.population\.learning_rate=\(0\.001, "):
    config_lib.from_config_dict(ml_collections.ConfigDict(values))


@pytest.mark.parametrize("item", ["length_penalty=nan", "temperature=inf", "top_p=NaN",
                                  "max_length_a=-inf"])
def test_a_non_finite_decode_override_is_named(item):
  key, _, text = item.partition("=")
  with pytest.raises(ConfigError, match=rf"^--decode {key}={float(text)!r} is not a finite "):
    config_lib.replace_from_text(helpers.section("decode"), [item], "decode")
