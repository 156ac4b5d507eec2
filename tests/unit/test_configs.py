"""The shipped configs: each builds; the WMT configs have the paper's sizes, data and batch."""

import pytest

from transformer_jax.config.files import SHIPPED
from transformer_jax.config.parse import from_config_dict
from transformer_jax.configs import (
  backtranslation,
  default,
  multi30k_ende,
  multi30k_modern,
  multilingual,
  tatoeba_deen,
  tiny,
  vaswani,
  wmt_base,
  wmt_big,
)
from transformer_jax.errors import ConfigError


@pytest.mark.parametrize("get_config", [default.get_config, tiny.get_config, wmt_base.get_config,
                                        wmt_big.get_config, tatoeba_deen.get_config,
                                        multi30k_modern.get_config, multilingual.get_config,
                                        vaswani.get_config, multi30k_ende.get_config])
def test_shipped_configs_build(get_config):
  cfg = from_config_dict(get_config())
  assert cfg.model.d_model % cfg.model.num_heads == 0


def test_no_shipped_config_reaches_into_the_development_tree():
  """Every shipped config runs from an installed wheel: no path to ../shared or above."""
  for path in sorted(SHIPPED.rglob("*.py")):
    text = path.read_text()
    assert "shared/" not in text and '"../' not in text, path


def test_the_back_translation_recipe_needs_its_folder_and_multilingual_uses_the_embedded_one():
  with pytest.raises(ConfigError, match=r"corpora\.bt and \.real read the same data .* the "
                                        "embedded corpus"):
    from_config_dict(backtranslation.get_config())
  config = backtranslation.get_config()
  config.data.corpora.bt.data_dir = "/somewhere/bt"
  assert from_config_dict(config).data.corpora["bt"].tag == "<BT>"
  corpora = from_config_dict(multilingual.get_config()).data.corpora
  assert {(c.source_lang, c.data_dir) for c in corpora.values()} == {
      ("de", ""), ("fr", ""), ("cs", "")}


def _paper_sizes(cfg):
  m = cfg.model
  return (m.num_encoder_layers, m.num_decoder_layers, m.d_model, m.num_heads, m.d_ff,
          m.dropout_rate, m.pre_layer_norm)


def _paper_blocks(cfg):
  """The paper's block and training choices, which the issue-17 variants leave as they were."""
  m, o = cfg.model, cfg.optimizer
  return (m.norm, m.ffn_activation, m.positional_encoding, m.kv_heads == m.num_heads,
          o.schedule, o.ema_decay)


def test_paper_configs_have_the_paper_sizes_data_and_batch():
  base = from_config_dict(wmt_base.get_config())
  big = from_config_dict(wmt_big.get_config())
  assert _paper_sizes(base) == (6, 6, 512, 8, 2048, 0.1, False)
  assert _paper_sizes(big) == (6, 6, 1024, 16, 4096, 0.3, False)
  for cfg in (base, big):
    assert _paper_blocks(cfg) == ("layernorm", "relu", "sinusoidal", True, "inverse_sqrt", 0.0)
    assert cfg.model.vocab_size == 32000 and cfg.data.tokenizer_max_chars == 10_000_000
    assert (cfg.data.dataset, cfg.data.train_split) == ("wmt17_translate/de-en", "train")
    # newstest2014 is the test split of TFDS's wmt14 (wmt17's is newstest2017).
    assert (cfg.data.test_dataset, cfg.data.test_split) == ("wmt14_translate/de-en", "test")
    assert (cfg.data.source_lang, cfg.data.target_lang) == ("en", "de")
    # ~25k source and ~25k target tokens: 256 packed rows of 128 slots per side.
    assert cfg.data.batch_size * cfg.data.max_source_length == 32768
  # 4000 warmup steps to d_model^-0.5 * 4000^-0.5.
  assert base.optimizer.learning_rate == pytest.approx(512**-0.5 * 4000**-0.5, rel=0.01)
  assert big.optimizer.learning_rate == pytest.approx(1024**-0.5 * 4000**-0.5, rel=0.01)
