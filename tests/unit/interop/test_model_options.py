"""Every model option has a row saying how CTranslate2 and Marian hold it, and a value of its
own in the shared model variants (so the CTranslate2 and decoding tests of every variant
test it); the reference page is the table's."""

import dataclasses

from tests import helpers
from tests.helpers import ROOT
from tests.model_variants import SIZES, VARIANTS
from transformer_jax.config.model import FREE, ModelConfig
from transformer_jax.interop import model_options


def test_every_model_option_has_one_row_and_only_free_ones_have_nothing_to_export():
  fields = {f.name: f.metadata["weights"] for f in dataclasses.fields(ModelConfig)}
  assert sorted(model_options.ROWS) == sorted(fields), \
      f"rows missing: {sorted(set(fields) - set(model_options.ROWS))}, " \
      f"rows of no option: {sorted(set(model_options.ROWS) - set(fields))}"
  for name, weights in fields.items():
    assert bool(model_options.ROWS[name].ctranslate2) == (weights != FREE), name


def test_every_option_that_weights_depend_on_takes_each_of_its_values_in_some_variant():
  taken = {}
  for overrides in VARIANTS.values():
    model = helpers.tiny_train_config(**overrides).model
    for f in dataclasses.fields(ModelConfig):
      taken.setdefault(f.name, set()).add(getattr(model, f.name))
  for f in dataclasses.fields(ModelConfig):
    if f.metadata["weights"] == FREE or f.name in SIZES:
      continue
    if f.metadata["choices"]:
      missing = set(f.metadata["choices"]) - taken[f.name]
      assert not missing, f"config.model.{f.name}: {sorted(missing)} in no variant"
    else:  # (a flag or a number: the tiny config's value and another)
      assert len(taken[f.name]) >= 2, f"config.model.{f.name} has one value in every variant"


def test_the_reference_page_is_the_table():
  assert (ROOT / "docs/reference/model-options.md").read_text() == model_options.page(), \
      "python -m transformer_jax.interop.model_options > docs/reference/model-options.md"
