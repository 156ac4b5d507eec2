"""Loading a trained run: what is missing or does not belong to it is named."""

import dataclasses
import json
import re
import shutil

import pytest

from tests import helpers
from transformer_jax.cli import evaluate as evaluate_cli
from transformer_jax.cli import train as train_cli
from transformer_jax.cli import translate as translate_cli
from transformer_jax.data import text, tokenizer
from transformer_jax.errors import CheckpointError, ConfigError
from transformer_jax.inference import trained_run
from transformer_jax.parallel import numerics
from transformer_jax.workdir import checkpoint_selection


def test_bad_checkpoint_selections_are_named(tiny_run):
  run = trained_run.load(tiny_run)
  with pytest.raises(CheckpointError, match=r"no checkpoint for step 15.*\[10, 20\]"):
    run.select("15")
  with pytest.raises(CheckpointError, match="unknown checkpoint selection"):
    run.select("newest")
  with pytest.raises(CheckpointError, match="names 2 models; translate takes one"):
    run.select_one("all", "translate")
  with pytest.raises(CheckpointError, match="no config.json"):
    trained_run.load(tiny_run / "checkpoints")


@pytest.mark.parametrize("has_ema", [False, True])
def test_every_label_the_tools_print_names_its_model_back(tiny_run, has_ema):
  selections = ["latest", "best", "all", "average:2", "steps:10,20", "steps:10"]
  if has_ema:
    selections += ["latest:raw", "best:ema", "average:2:raw"]
  for given in selections:
    for chosen in checkpoint_selection.select(tiny_run, given, has_ema):
      (named,) = checkpoint_selection.select(tiny_run, chosen.label, has_ema)
      if has_ema and chosen.weights == "auto":  # (a run's default weights: its average)
        chosen = dataclasses.replace(chosen, weights="ema")
      assert named == chosen, chosen.label
  with pytest.raises(CheckpointError, match=r"average_last_1_to_10: that model is gone "
                                            r"\(average:1 is now average_last_1_to_20\)"):
    checkpoint_selection.select(tiny_run, "average_last_1_to_10", has_ema)


def test_workdir_without_checkpoints_is_named(tiny_run, tmp_path):
  bare = tmp_path / "bare"
  bare.mkdir()
  for name in ("config.json", "spm.model", "tokenizer.json"):
    shutil.copy(tiny_run / name, bare / name)
  with pytest.raises(CheckpointError, match="no checkpoints in .*bare/checkpoints"):
    trained_run.load(bare)
  (bare / "checkpoints").mkdir()
  with pytest.raises(CheckpointError, match="no checkpoints yet"):
    trained_run.load(bare).select("latest")


def test_tokenizer_that_does_not_match_the_run_is_named(tiny_run, tmp_path):
  other = tmp_path / "other"
  other.mkdir()
  for name in ("config.json", "tokenizer.json"):
    shutil.copy(tiny_run / name, other / name)
  (other / "checkpoints").symlink_to(tiny_run / "checkpoints")
  sentences = list(text.read_lines(helpers.ROOT / "transformer_jax/corpora/multi30k/val.en.gz"))
  tokenizer.train_tokenizer(sentences, 300, other / "spm.model")  # another vocabulary
  with pytest.raises(CheckpointError, match="spm.model is not the one .* trained with"):
    trained_run.load(other)
  status, _, err = helpers.run_tool(translate_cli.main, f"--workdir={other}", stdin=b"Ein Hund.\n")
  assert status == 1 and helpers.one_line_error(err).startswith("translate: tokenizer ")


def test_a_config_json_from_before_later_keys_still_loads(tiny_run, tmp_path):
  run = helpers.copy_run(tiny_run, tmp_path / "old")
  config = json.loads((run / "config.json").read_text())
  del config["time_budget_minutes"], config["optimizer"]["cooldown_fraction"]
  (run / "config.json").write_text(json.dumps(config))
  loaded = trained_run.load(run)
  assert loaded.cfg.time_budget_minutes == 0.0 and loaded.cfg.optimizer.cooldown_fraction == 0.0
  config["model"]["dropout_rat"] = 0.1  # (a key no config has: the error names the file)
  (run / "config.json").write_text(json.dumps(config))
  with pytest.raises(ConfigError, match=rf"^{run / 'config.json'}: .*dropout_rat"):
    trained_run.load(run)
  assert loaded.select_one("latest", "translate")  # and its checkpoints are there to use


def test_a_config_json_that_is_not_json_is_one_line_naming_it_in_every_tool(tiny_run, tmp_path):
  run = tmp_path / "run"
  run.mkdir()
  for name in ("spm.model", "tokenizer.json"):
    shutil.copy(tiny_run / name, run / name)
  (run / "checkpoints").symlink_to(tiny_run / "checkpoints")
  config = run / "config.json"
  cut = (tiny_run / "config.json").read_text()[:500]  # (cut short: a full disk, a bad copy)
  config.write_text(cut)
  for tool, args in ((translate_cli.main, []), (evaluate_cli.main, []),
                     (train_cli.main, ["--config=configs/tiny.py"])):
    status, _, err = helpers.run_tool(tool, f"--workdir={run}", *args, stdin=b"Ein Hund.\n")
    line = helpers.one_line_error(err)
    assert status == 1 and re.fullmatch(rf"\w+: {config} is damaged: not JSON \(.+: line \d+ "
                                        r"column \d+\); it is left as it is", line), line
  assert config.read_text() == cut


def test_a_run_trained_in_bf16_decodes_in_this_machines_dtype_unless_asked(tiny_run, tmp_path):
  run = helpers.copy_run(tiny_run, tmp_path / "bf16")
  config = json.loads((run / "config.json").read_text())
  config["model"]["dtype"] = "bfloat16"
  (run / "config.json").write_text(json.dumps(config))
  machine = numerics.resolve("auto").dtype
  assert trained_run.load(run).cfg.model.dtype == machine
  assert trained_run.load(run, dtype="bfloat16").cfg.model.dtype == "bfloat16"
  config["model"]["dtype"] = "float32"  # a run trained in f32 stays in f32
  (run / "config.json").write_text(json.dumps(config))
  assert trained_run.load(run).cfg.model.dtype == "float32"
