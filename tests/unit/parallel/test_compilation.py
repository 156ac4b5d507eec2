"""Where the persistent compilation cache goes: one folder per machine kind, JAX's own settings
first, a switch to turn it off, and the time spent preparing programs."""

import types

import jax
import jax.numpy as jnp

from transformer_jax.parallel import compilation, program_store


def test_the_cache_is_per_machine_unless_jax_settings_or_the_switch_decide(tmp_path, monkeypatch):
  root = tmp_path / "jax_cache"
  folder = compilation.cache_dir({}, None, root)
  assert folder is not None and folder.parent == root and len(folder.name) == 16
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_xnnpack=false")  # another machine kind
  assert compilation.cache_dir({}, None, root) != folder
  assert compilation.cache_dir({"JAX_COMPILATION_CACHE_DIR": "/x"}, None, root) is None
  assert compilation.cache_dir({}, "/already/set", root) is None
  assert compilation.cache_dir({compilation.SWITCH: "0"}, None, root) is None
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the default root follows it
  assert compilation.cache_dir({}, None).parent == tmp_path / "xdg" / "transformer_jax" / \
      "jax_cache"


def test_enabling_points_jax_at_this_machines_folder(tmp_path, monkeypatch):
  """With no JAX setting, enable_compilation_cache creates the machine's folder and sets
  jax_compilation_cache_dir to it, and the compile time from which programs are kept (JAX's
  config simulated, so this process keeps its own)."""
  updates = {}
  fake_config = types.SimpleNamespace(jax_compilation_cache_dir=None,
                                      update=lambda key, value: updates.update({key: value}))
  monkeypatch.setattr(compilation, "jax", types.SimpleNamespace(config=fake_config))
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "root"))
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  monkeypatch.delenv(compilation.SWITCH, raising=False)
  monkeypatch.setitem(program_store._store, "folder", None)  # (off again after the test)
  compilation.enable_compilation_cache()
  expected = compilation.cache_dir({}, None, tmp_path / "root" / "transformer_jax" / "jax_cache")
  assert updates == {"jax_compilation_cache_dir": str(expected),
                     "jax_persistent_cache_min_compile_time_secs":
                     compilation.MIN_COMPILE_SECONDS} and expected.is_dir()
  # ...and the program store at its own folder, which the switch turns off too
  store = tmp_path / "root" / "transformer_jax" / "programs"
  assert program_store.folder().parent == store and program_store.folder().name == \
      expected.name
  assert compilation.program_store_dir({compilation.SWITCH: "0"}) is None



def test_program_seconds_counts_preparing_a_new_program_and_not_running_it():
  program = jax.jit(lambda x: jnp.tanh(x) * 3.0 + jnp.arange(x.shape[0]))
  before = compilation.program_seconds()
  jax.block_until_ready(program(jnp.ones(7)))
  prepared = compilation.program_seconds() - before
  assert prepared > 0.0
  before = compilation.program_seconds()
  for _ in range(3):
    jax.block_until_ready(program(jnp.ones(7)))
  assert compilation.program_seconds() == before  # (the same program again: nothing to do)
