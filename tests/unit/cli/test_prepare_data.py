"""prepare_data: a config's datasets and tokenizer made ahead of training, then reused."""

from tests import helpers
from transformer_jax.cli import prepare_data
from transformer_jax.data import corpus
from transformer_jax.data.plan import data_plan
from transformer_jax.workdir.preparation import load_tokenizer


def test_prepares_datasets_and_tokenizer_that_training_reuses(tmp_path):
  cache, workdir = tmp_path / "tfds", tmp_path / "run"
  status, out, err = helpers.run_tool(prepare_data.main, "--config=configs/tiny.py",
                                      f"--workdir={workdir}", f"--config.data.cache_dir={cache}")
  assert status == 0, err[-3000:]
  assert "local:train: 29,000 pairs" in out and "local:val: 1,014 pairs" in out
  model = workdir / "spm.model"
  assert model.is_file() and list(cache.rglob("*.array_record-*"))
  stamps = {p: p.stat().st_mtime_ns for p in [model, *cache.rglob("*.array_record-*")]}
  # Training then finds both: nothing is prepared or trained again.
  cfg = helpers.tiny_train_config(**{"data.cache_dir": str(cache)})
  assert load_tokenizer(cfg, workdir, data_plan(cfg.data)).model_proto == model.read_bytes()
  assert len(corpus.get_source(corpus.corpus_spec(cfg.data), "train")) == 29000
  assert stamps == {p: p.stat().st_mtime_ns for p in stamps}


def test_a_bad_data_folder_is_named(tmp_path):
  status, _, err = helpers.run_tool(prepare_data.main, "--config=configs/tiny.py",
                                    f"--workdir={tmp_path / 'run'}",
                                    f"--config.data.data_dir={tmp_path / 'nowhere'}",
                                    f"--config.data.cache_dir={tmp_path / 'tfds'}")
  assert status == 1 and "nowhere does not exist" in helpers.one_line_error(err)
