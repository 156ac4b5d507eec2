"""What a fresh process imports: the config layer loads neither TFDS, grain, TensorFlow nor JAX,
the sweep launcher no data library; the default (local-corpus) path runs without TensorFlow,
an optional extra for TFDS's WMT builders."""

import subprocess
import sys

from tests.helpers import ROOT

HEAVY = "{'tensorflow', 'tensorflow_datasets', 'grain', 'jax', 'flax', 'orbax', 'optuna'}"


def _heavy_imports(module: str) -> str:
  code = (f"import sys, {module}; "
          f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {HEAVY}))")
  r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  return r.stdout.strip()


def test_the_config_modules_import_nothing_heavy():
  assert _heavy_imports("transformer_jax.config.parse, transformer_jax.config.files") == "[]"


def test_the_sweep_launcher_reads_no_data():
  # (it starts training subprocesses: Optuna and JAX's process index, no TFDS, grain or TF)
  assert _heavy_imports("transformer_jax.cli.sweep") == "['jax', 'optuna']"


def test_the_default_path_does_not_import_tensorflow(tmp_path):
  code = ("import sys; from transformer_jax.cli import train, evaluate, translate, sweep;"
          "from transformer_jax.data import corpus; from transformer_jax.configs import default;"
          "spec = corpus.CorpusSpec('local', '', 'de', 'en', ('val',), sys.argv[1]);"
          "assert len(corpus.get_source(spec, 'val')) == 1014;"
          "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))")
  r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "tfds")], cwd=ROOT,
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 0, r.stderr[-2000:]
  assert r.stdout.strip() == "[]"
