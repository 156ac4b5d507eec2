"""What a resumed run keeps as it was trained, whatever its command line says."""

import json
import logging

from tests import helpers
from transformer_jax.config import sections
from transformer_jax.training import settled_config
from transformer_jax.workdir import layout


def _recorded(workdir, **changes) -> dict:
  """A config.json of the tiny config in `workdir`, with `changes` (section -> keys; None
  deletes a key, as a run from before it has none)."""
  config = helpers.tiny_config().to_dict()
  for section, keys in changes.items():
    for key, value in keys.items():
      if value is None:
        del config[section][key]
      else:
        config[section][key] = value
  workdir.mkdir(exist_ok=True)
  (workdir / layout.CONFIG).write_text(json.dumps(config))
  return config


def test_a_resumed_run_keeps_its_weight_decay_rule_and_data_order(tmp_path, caplog):
  """A run from before weight_decay_exclude resumes decaying by rank, as it trained; one that
  recorded its rule keeps it; either way the config.json written next says what is used."""
  cfg = helpers.tiny_train_config(**{"optimizer.weight_decay": 0.1})
  config_dict = helpers.tiny_config(**{"optimizer.weight_decay": 0.1}).to_dict()
  _recorded(tmp_path / "old", optimizer={"weight_decay_exclude": None})
  with caplog.at_level(logging.WARNING):
    kept, kept_dict = settled_config.keep_as_trained(cfg, config_dict, tmp_path / "old")
  assert kept.optimizer.weight_decay_exclude == (sections.DECAY_BY_RANK,)
  assert kept_dict["optimizer"]["weight_decay_exclude"] == (sections.DECAY_BY_RANK,)
  assert "config.optimizer.weight_decay_exclude=('*bias', '*scale') differs from the " \
         "('ndim<2',) this run was trained with" in caplog.text
  _recorded(tmp_path / "new", optimizer={"weight_decay_exclude": ["*bias"]},
            data={"num_workers": 2})
  kept, _ = settled_config.keep_as_trained(cfg, config_dict, tmp_path / "new")
  assert (kept.optimizer.weight_decay_exclude, kept.data.num_workers) == (("*bias",), 2)
  same, same_dict = settled_config.keep_as_trained(cfg, config_dict, tmp_path / "fresh")
  assert same is cfg and same_dict is config_dict  # (a new run: nothing recorded)
