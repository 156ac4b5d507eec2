"""The package as a user installs it: `pip install .` (not editable) builds without a warning
from the build backend, puts nothing into site-packages but `transformer_jax`, and, from a
folder outside the source tree, trains the shipped tiny config on the embedded corpus, and the
multilingual and back-translation recipes (their data shipped or made beside) for 2 steps.

The fresh venv gets this test environment's installed dependencies through a path file (they
are what `pip install .` would fetch; installing them again would only repeat the download),
but not its editable install of the checkout: a path file's folders are not site folders, so
their own path files (the editable finder's) are not run.
"""

import json
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

from tests.helpers import ROOT


def _site_packages(python: Path) -> Path:
  out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                        "['purelib'])"], capture_output=True, text=True, check=True)
  return Path(out.stdout.strip())


def _clean_env():
  env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
  env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
  return env


def test_pip_install_dot_installs_only_transformer_jax_and_trains_the_shipped_tiny_config(
    tmp_path):
  fresh = tmp_path / "venv"
  venv.create(fresh, with_pip=True)
  python = fresh / "bin" / "python"
  site = _site_packages(python)
  before = set(os.listdir(site))
  deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
  (site / "test_dependencies.pth").write_text("\n".join(sorted(deps)) + "\n")

  r = subprocess.run([str(python), "-m", "pip", "install", "-v", "--no-deps", str(ROOT)],
                     capture_output=True, text=True, timeout=600, env=_clean_env(), cwd=tmp_path)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  log = r.stdout + r.stderr
  for warning in ("Deprecat", "BuildBackendWarning", "SetuptoolsWarning"):
    assert warning not in log, log[max(0, log.find(warning) - 2000):log.find(warning) + 1000]
  added = set(os.listdir(site)) - before - {"test_dependencies.pth"}
  assert {name for name in added if not name.endswith(".dist-info")} == {"transformer_jax"}, added
  assert {name for name in added if name.endswith(".dist-info")} == {
      "transformer_jax-0.1.0.dist-info"}, added

  outside = tmp_path / "elsewhere"  # (no configs/ folder, no checkout on the path)
  outside.mkdir()
  where = subprocess.run(
      [str(python), "-c", "import transformer_jax, importlib.util; print(transformer_jax.__file__);"
       " print(importlib.util.find_spec('configs'))"],
      capture_output=True, text=True, cwd=outside, env=_clean_env(), check=True).stdout.split()
  assert where == [str(site / "transformer_jax" / "__init__.py"), "None"]

  workdir = outside / "run"
  r = subprocess.run(
      [str(fresh / "bin" / "transformer-jax-train"), "--config=configs/tiny.py",
       f"--workdir={workdir}", "--config.num_train_steps=4", "--config.eval_every_steps=4",
       "--config.checkpoint_every_steps=4", "--config.eval_max_sentences=4",
       f"--config.data.cache_dir={tmp_path / 'tfds'}"],
      capture_output=True, text=True, timeout=600, cwd=outside, env=_clean_env())
  assert r.returncode == 0, r.stderr[-4000:]
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [rec["step"] for rec in records if "train/loss" in rec][-1] == 4
  assert any("eval/bleu" in rec for rec in records)
  assert (workdir / "checkpoints" / "4").is_dir()
  assert json.loads((workdir / "config.json").read_text())["model"]["d_model"] == 32
  assert sys.prefix != str(fresh)  # (the test itself ran in the test environment)

  # The mixture recipes, from the wheel too (2 steps at a tiny size: their data, not their
  # model, is the point): multilingual on the embedded de/fr/cs-en Multi30k; back-translation
  # with a back-translated folder made beside (translate-corpus's output format).
  bt = outside / "bt"
  bt.mkdir()
  (bt / "train.de").write_text("ein hund läuft .\nzwei männer sitzen .\n" * 20)
  (bt / "train.en").write_text("a dog runs .\ntwo men sit .\n" * 20)
  small = ["--config.num_train_steps=2", "--config.eval_every_steps=2",
           "--config.checkpoint_every_steps=2", "--config.eval_max_sentences=2",
           "--config.model.d_model=32", "--config.model.d_ff=64", "--config.model.num_heads=2",
           "--config.model.num_encoder_layers=1", "--config.model.num_decoder_layers=1",
           "--config.model.vocab_size=400", "--config.data.tokenizer_max_sentences=3000",
           "--config.data.batch_size=8", "--config.data.test_split=",
           "--config.time_budget_minutes=0", f"--config.data.cache_dir={tmp_path / 'tfds'}"]
  recipes = {"multilingual": [f"--config.data.corpora.{lang}.test_split=" for lang in ("fr", "cs")],
             "backtranslation": [f"--config.data.corpora.bt.data_dir={bt}"]}
  for name, extra in recipes.items():
    r = subprocess.run(
        [str(fresh / "bin" / "transformer-jax-train"), f"--config=configs/{name}.py",
         f"--workdir={outside / name}", *small, *extra],
        capture_output=True, text=True, timeout=600, cwd=outside, env=_clean_env())
    assert r.returncode == 0, name + ": " + r.stderr[-4000:]
    assert (outside / name / "checkpoints" / "2").is_dir(), name
