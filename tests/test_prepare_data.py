"""prepare_data: a config's datasets and tokenizer made ahead of training, then reused."""

import subprocess
import sys

from configs import tiny
from tests.conftest import ROOT
from transformer_jax import config as config_lib, corpus, train_lib


def test_prepares_datasets_and_tokenizer_that_training_reuses(tmp_path):
  cache, workdir = tmp_path / "tfds", tmp_path / "run"
  flags = ["--config=configs/tiny.py", f"--workdir={workdir}",
           f"--config.data.cache_dir={cache}"]
  r = subprocess.run([sys.executable, "-m", "transformer_jax.prepare_data", *flags], cwd=ROOT,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "local:train: 29,000 pairs" in r.stdout and "local:val: 1,014 pairs" in r.stdout
  model = workdir / "spm.model"
  assert model.is_file() and list(cache.rglob("*.array_record-*"))
  stamps = {p: p.stat().st_mtime_ns for p in [model, *cache.rglob("*.array_record-*")]}
  # Training then finds both: nothing is prepared or trained again.
  c = tiny.get_config()
  c.data.cache_dir = str(cache)
  cfg = config_lib.from_config_dict(c)
  assert train_lib.load_tokenizer(cfg, workdir).model_proto == model.read_bytes()
  assert len(corpus.get_source(cfg.data.corpus_spec(), "train")) == 29000
  assert stamps == {p: p.stat().st_mtime_ns for p in stamps}


def test_a_bad_data_folder_is_named(tmp_path):
  r = subprocess.run([sys.executable, "-m", "transformer_jax.prepare_data",
                      "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}",
                      f"--config.data.data_dir={tmp_path / 'nowhere'}",
                      f"--config.data.cache_dir={tmp_path / 'tfds'}"],
                     cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode != 0 and "nowhere does not exist" in r.stderr
