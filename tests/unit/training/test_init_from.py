"""Fine-tuning from another run (config.init_from): the run starts from the source's weights,
with a fresh optimizer and step 0 and the source's tokenizer, and trains on; what does not fit
is a one-line error naming it."""

import json

import jax
import numpy as np
import pytest

from tests import helpers
from transformer_jax.cli import train as train_cli
from transformer_jax.config.parse import from_config_dict
from transformer_jax.errors import CheckpointError, ConfigError
from transformer_jax.inference import trained_run
from transformer_jax.training.run import open_run


def _open(workdir, tfds_cache, source, **overrides):
  c = helpers.tiny_config(**{"data.cache_dir": str(tfds_cache), "init_from.workdir": str(source),
                             "init_from.checkpoint": "latest", **overrides})
  return open_run(from_config_dict(c), workdir, c.to_dict())


def test_a_fine_tuning_run_starts_at_its_sources_validation_loss_and_trains_on(
    tiny_run, tfds_cache, tmp_path):
  """(The new run keeps a moving average, the source none: it starts at the loaded weights.)"""
  source = trained_run.load(tiny_run)
  theirs = source.params(source.select_one("latest", "test"))
  with _open(tmp_path / "ft", tfds_cache, tiny_run, **{"optimizer.ema_decay": 0.99}) as run:
    assert run.start_step == 0 and int(run.state.step) == 0
    assert not any(np.any(np.asarray(x)) for x in jax.tree_util.tree_leaves(
        run.state.opt_state) if np.ndim(x))  # (Adam's moments afresh)
    evaluator = run.evaluators[""]
    start = evaluator.loss(run.state.eval_params)
    assert abs(start - evaluator.loss(theirs)) < 1e-6
    for step in range(1, 6):
      run.train(step)
    assert evaluator.loss(run.state.eval_params) < start - 0.01
  assert (tmp_path / "ft" / "spm.model").read_bytes() == (tiny_run / "spm.model").read_bytes()
  record = json.loads((tmp_path / "ft" / "init_from.json").read_text())
  assert record["steps"] == [20] and record["workdir"] == str(tiny_run.absolute())
  saved = json.loads((tmp_path / "ft" / "config.json").read_text())["init_from"]
  assert saved == {"workdir": str(tiny_run), "checkpoint": "latest"}


@pytest.mark.parametrize("overrides, error, message", [
    ({"model.d_ff": 128}, ConfigError,
     r"config.init_from \(step_20\): parameter \S+/feed_forward/wi/\w+ is \([\d, ]*64,?\) in "
     r"\S+ but \([\d, ]*128,?\) in this config's model"),
    ({"model.norm": "rmsnorm"}, ConfigError, r"parameter \S+/bias of \S+ has no place"),
    ({"model.positional_encoding": "rotary"}, ConfigError,
     r"config.model.positional_encoding='rotary', but \S+ was trained with 'sinusoidal'"),
    ({"init_from.checkpoint": "7"}, CheckpointError, "no checkpoint for step 7"),
    ({"init_from.checkpoint": "all"}, CheckpointError, "names 2 models of"),
])
def test_a_source_that_does_not_fit_is_named(tiny_run, tfds_cache, tmp_path, overrides, error,
                                             message):
  with pytest.raises(error, match=message):
    with _open(tmp_path / "ft", tfds_cache, tiny_run, **overrides):
      pass


def test_another_tokenizer_or_no_run_is_a_one_line_error(tiny_run, tfds_cache, tmp_path):
  _, other = helpers.small_corpus(tmp_path)
  with pytest.raises(ConfigError, match=r"its tokenizer \S+ \(fingerprint \w+\) is not this "
                                        r"run's \S+spm.model"):
    with _open(tmp_path / "ft", tfds_cache, tiny_run, **{"data.tokenizer_path": other.path}):
      pass
  status, _, err = helpers.run_tool(
      train_cli.main, "--config=configs/tiny.py", f"--workdir={tmp_path / 'ft2'}",
      f"--config.init_from.workdir={tmp_path / 'nothing'}")
  assert status != 0 and "config.init_from.workdir=" in helpers.one_line_error(err)
  assert "no config.json there" in helpers.one_line_error(err)
