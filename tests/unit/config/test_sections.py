"""The section dataclasses: contradictions fail with the key named; the shipped configs are the
one place their values live."""

import dataclasses
import re

import pytest

from tests import helpers
from transformer_jax.config import fields, sections
from transformer_jax.config.parse import from_config_dict
from transformer_jax.configs import default
from transformer_jax.errors import ConfigError
from transformer_jax.workdir import layout


def test_every_field_is_set_by_the_default_config_and_defaults_nowhere_else():
  values = default.get_config().to_dict()
  for name, cls in [*sections.SECTIONS.items(), ("", sections.TrainConfig)]:
    given = values[name] if name else values
    for field in dataclasses.fields(cls):
      assert field.default is dataclasses.MISSING, f"{cls.__name__}.{field.name} has a default"
      assert field.name in given, f"configs/default.py does not set config.{name}.{field.name}"


def test_d_model_not_divisible_by_num_heads_is_named():
  with pytest.raises(ConfigError, match=r"d_model=32 is not divisible .*num_heads=5"):
    from_config_dict(helpers.tiny_config(**{"model.num_heads": 5}))
  with pytest.raises(ConfigError, match=r"d_model=30 is not divisible by .*num_heads=4"):
    helpers.section("model", d_model=30, num_heads=4)


def test_contradictory_lengths_are_rejected():
  with pytest.raises(ConfigError, match=r"config\.model\.max_len=16"):
    from_config_dict(helpers.tiny_config(**{"model.max_len": 16}))


def test_decode_config_rejects_contradictions():
  with pytest.raises(ConfigError, match="greedy and config.decode.sampling"):
    helpers.section("decode", greedy=True, sampling=True)
  with pytest.raises(ConfigError, match="nbest=5 must be in"):
    helpers.section("decode", beam_size=4, nbest=5)
  with pytest.raises(ConfigError, match=r"length_penalty=-0.5 must be >= 0"):
    helpers.section("decode", length_penalty=-0.5)


@pytest.mark.parametrize("mode, key, value", [
    ({}, "temperature", 0.7), ({}, "top_k", 5), ({"greedy": True}, "top_p", 0.9),
    ({"greedy": True}, "min_length", 3), ({"sampling": True}, "min_length", 3)])
def test_a_decode_setting_its_mode_ignores_is_an_error(mode, key, value):
  name = "sampling" if mode.get("sampling") else "greedy decoding" if mode else "beam search"
  with pytest.raises(ConfigError, match=rf"^config\.decode\.{key}={value} has no effect in "
                                        rf"{name}; leave it at"):
    helpers.section("decode", **mode, **{key: value})
  helpers.section("decode", **mode)  # (at the value that turns it off: accepted)


def test_data_config_rejects_same_languages():
  with pytest.raises(ConfigError, match="source_lang and target_lang"):
    helpers.section("data", target_lang="de")


def test_parallelism_config_takes_at_most_one_free_axis():
  with pytest.raises(ConfigError, match="at most one -1"):
    helpers.section("parallelism", mesh_shape=(-1, -1, 1))
  with pytest.raises(ConfigError, match="unknown mesh axis 'model'"):
    helpers.section("parallelism", axis_rules=(("embed", "model"),))


def test_subword_sampling_settings_fail_fast_with_the_key_named():
  for values, message in (({"alpha": 1.5}, r"subword_sampling\.alpha=1\.5 must be in \[0, 1\]"),
                          ({"alpha": 0.1, "nbest_size": 1}, r"nbest_size=1 must be -1"),
                          ({"beta": 0.1}, r"subword_sampling\.beta")):
    with pytest.raises(ConfigError, match=message):
      helpers.section("data", subword_sampling=values)
  with pytest.raises(ConfigError, match="subword_sampling needs config.data.pretokenize=True"):
    helpers.section("data", subword_sampling={"alpha": 0.1}, pretokenize=False)
  assert not helpers.section("data").subword_sampling.active  # (off in the default config)


@pytest.mark.parametrize("key, value, error", [
    ("top_p", 0.0, "top_p=0.0 must be in (0, 1]"), ("top_p", 1.5, "top_p=1.5 must be in (0, 1]"),
    ("temperature", 0.0, "temperature=0.0 must be > 0"), ("top_k", -1, "top_k=-1 must be >= 0"),
    ("max_length", 0, "max_length=0 must be >= 1"), ("nbest", 0, "nbest=0 must be >= 1"),
    ("no_repeat_ngram_size", -1, "no_repeat_ngram_size=-1 must be in [0, 16]"),
    ("no_repeat_ngram_size", 17, "no_repeat_ngram_size=17 must be in [0, 16]"),
    ("repetition_penalty", 0.0, "repetition_penalty=0.0 must be > 0")])
def test_a_decoding_option_out_of_its_declared_range_is_named(key, value, error):
  with pytest.raises(ConfigError, match=f"^config\\.decode\\.{re.escape(error)}$"):
    helpers.section("decode", **{key: value})


def test_a_run_from_before_the_repetition_options_decodes_without_them():
  """(config.json of such a run has neither key: it reads as 0 and 1.0, both off)"""
  decode = layout.with_added_decode_keys({"beam_size": 4})
  assert (decode["no_repeat_ngram_size"], decode["repetition_penalty"]) == (0, 1.0)
  assert fields.unhonoured(helpers.section("decode"), "jax") == []


@dataclasses.dataclass(frozen=True)
class _Options:
  theirs: str = fields.option(before="", ctranslate2=None)
  ours: int = fields.option(before=0, ctranslate2="keyword", search=False)


def test_an_engine_refuses_what_its_declaration_says_it_cannot_honour_in_one_line():
  assert fields.unhonoured(_Options("", 0), "jax") == []
  with pytest.raises(ConfigError, match=r"^decode\.theirs='x': the ctranslate2 engine cannot "
                                        r"honour it \(leave it at '', or use --engine=jax\)$"):
    fields.check_honoured(_Options("x", 0), "ctranslate2", "decode")
  with pytest.raises(ConfigError, match=r"^decode\.ours=2: the jax engine cannot honour it "
                                        r"\(leave it at 0, or use --engine=ctranslate2\)$"):
    fields.check_honoured(_Options("", 2), "jax", "decode")
  with pytest.raises(TypeError, match="needs `before`"):
    fields.option(ctranslate2=None)
