"""Where the persistent compilation cache goes: one folder per machine kind, JAX's own settings
first, and a switch to turn it off."""

from pathlib import Path

from transformer_jax.parallel import compilation


def test_the_cache_is_per_machine_unless_jax_settings_or_the_switch_decide(tmp_path, monkeypatch):
  root = tmp_path / "jax_cache"
  folder = compilation.cache_dir({}, None, root)
  assert folder is not None and folder.parent == root and len(folder.name) == 16
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_xnnpack=false")  # another machine kind
  assert compilation.cache_dir({}, None, root) != folder
  assert compilation.cache_dir({"JAX_COMPILATION_CACHE_DIR": "/x"}, None, root) is None
  assert compilation.cache_dir({}, "/already/set", root) is None
  assert compilation.cache_dir({compilation.SWITCH: "0"}, None, root) is None
  assert isinstance(compilation.DEFAULT_ROOT, Path)
