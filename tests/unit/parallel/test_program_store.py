"""The program store (parallel/program_store.py): a program is compiled once, stored under a key
of what determines it, and loaded by a later process without tracing; a damaged file or one
JAX's cache handed over is never what runs."""

import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.parallel import program_store
from transformer_jax.parallel.program_store import StoredJit

TRACES = []


def scaled_sum(x, y, *, scale: float):
  TRACES.append(x.shape)  # (runs only while tracing)
  return (x * scale + jnp.sum(y), {"max": jnp.max(x)})


@pytest.fixture
def store(tmp_path, monkeypatch):
  # (keys of this test's own: JAX's persistent cache, shared by the suite, has never seen them;
  # conftest turns the store off again after the test)
  monkeypatch.setattr(program_store, "_environment", lambda: str(tmp_path))
  program_store.enable(tmp_path)
  TRACES.clear()
  return tmp_path


def test_a_stored_program_is_loaded_by_a_new_process_without_tracing(store):
  x, y = np.arange(6, dtype=np.float32).reshape(2, 3), jnp.ones((4,), jnp.float32)
  first = StoredJit(scaled_sum, ("scale",))
  out = first(x, y, scale=2.0)
  assert TRACES == [(2, 3)] and len(list(store.glob("scaled_sum-*.bin"))) == 1
  first(x, y, scale=2.0)  # (this process: the program it holds)
  assert TRACES == [(2, 3)]
  later = StoredJit(scaled_sum, ("scale",))  # (a new process: nothing held, the file there)
  again = later(x + 1, y, scale=2.0)
  assert TRACES == [(2, 3)]
  np.testing.assert_array_equal(again[0], (x + 1) * 2.0 + 4.0)
  assert float(again[1]["max"]) == 6.0 and float(out[1]["max"]) == 5.0


def test_each_static_value_shape_dtype_and_placement_is_a_program_of_its_own(store):
  program = StoredJit(scaled_sum, ("scale",))
  x, y = np.ones((2, 3), np.float32), np.ones((4,), np.float32)
  program(x, y, scale=2.0)
  program(x, y, scale=3.0)
  program(np.ones((3, 3), np.float32), y, scale=2.0)
  program(x.astype(np.int32), y, scale=2.0)
  program(jax.device_put(x), y, scale=2.0)  # (a jax array: its sharding is part of the key)
  assert len(TRACES) == 5 and len(list(store.glob("*.bin"))) == 5
  np.testing.assert_array_equal(program(x, y, scale=3.0)[0], np.full((2, 3), 7.0))


def test_a_damaged_file_is_compiled_again_and_replaced(store, caplog):
  x, y = np.ones((2, 3), np.float32), np.ones((4,), np.float32)
  StoredJit(scaled_sum, ("scale",))(x, y, scale=2.0)
  [path] = store.glob("*.bin")
  path.write_bytes(b"not a program")
  out = StoredJit(scaled_sum, ("scale",))(x, y, scale=2.0)
  assert "cannot be loaded" in caplog.text and str(path) in caplog.text
  np.testing.assert_array_equal(out[0], np.full((2, 3), 6.0))
  assert path.read_bytes() != b"not a program"
  traced = len(TRACES)  # (2, or 3 where JAX's cache kept the first and handed it over)
  StoredJit(scaled_sum, ("scale",))(x, y, scale=2.0)
  assert len(TRACES) == traced  # (the new file loads)


def plain_product(x, scale):
  return x * scale


def test_static_arguments_are_keyword_only_the_others_positional_and_closures_refused(store):
  with pytest.raises(TypeError, match="'scale' must be keyword-only"):
    StoredJit(plain_product, ("scale",))
  with pytest.raises(TypeError, match=r"give \['y'\] positionally"):
    StoredJit(scaled_sum, ("scale",))(np.ones(2), y=np.ones(2), scale=1.0)

  def scaled_by(factor):
    def times(x):
      return x * factor
    return times
  with pytest.raises(TypeError, match="module-level function"):  # (2.0 and 3.0: one key)
    StoredJit(scaled_by(2.0))


def test_a_python_number_is_an_argument_like_jax_jits(store):
  program = StoredJit(plain_product)
  np.testing.assert_array_equal(program(np.ones(2, np.float32), 1.5), [1.5, 1.5])
  np.testing.assert_array_equal(StoredJit(plain_product)(np.ones(2, np.float32), 2.5),
                                [2.5, 2.5])  # (the stored program, another value)
  assert len(list(store.glob("plain_product-*.bin"))) == 1


def printed(x):
  jax.debug.print("{}", x)  # (a host callback)
  return x + 1


def test_a_program_that_cannot_be_serialized_runs_and_is_not_stored(store, caplog):
  out = StoredJit(printed)(np.ones(2, np.float32))
  np.testing.assert_array_equal(out, [2.0, 2.0])
  assert "not stored" in caplog.text and not list(store.glob("*.bin"))


def test_the_packages_source_is_read_once_when_the_store_is_enabled(tmp_path, monkeypatch):
  """(a long run keys its programs by the source it imported, not by files edited since)"""
  reads = []
  monkeypatch.setattr(program_store, "_source", lambda: reads.append(1) or str(tmp_path))
  program_store.enable(tmp_path)
  for n in (2, 3):
    StoredJit(scaled_sum, ("scale",))(np.ones((n, 1), np.float32), np.ones(1), scale=1.0)
  assert reads == [1] and len(list(tmp_path.glob("*.bin"))) == 2


def test_enabling_the_store_starts_no_jax_backend():
  """(a multi-host run enables it before jax.distributed.initialize, which must come first)"""
  script = textwrap.dedent("""
      from jax._src import xla_bridge
      from transformer_jax.parallel import program_store
      program_store.enable("/nonexistent/store")
      print(xla_bridge.backends_are_initialized())
  """)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=120)
  assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_off_it_is_jax_jit():
  assert program_store.folder() is None  # (conftest: off unless a test turns it on)
  out = StoredJit(scaled_sum, ("scale",))(np.ones((2, 2), np.float32), np.ones(1), scale=2.0)
  np.testing.assert_array_equal(out[0], np.full((2, 2), 3.0))


def test_a_program_jax_s_cache_hands_over_is_compiled_afresh_before_it_is_stored(tmp_path):
  """The store lost a file that JAX's persistent cache still holds (same key, same name): the
  program JAX loads runs, but its serialized copy would not (XLA:CPU), so it is compiled once
  more under a fresh name and that one is stored; a third process loads it and gets the right
  values. (A process of its own: JAX's cache is set up once per process.)"""
  script = textwrap.dedent(f"""
      import pathlib, jax, jax.numpy as jnp, numpy as np
      jax.config.update("jax_compilation_cache_dir", {str(tmp_path / "jax")!r})
      jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
      jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
      from transformer_jax.parallel import program_store
      store = pathlib.Path({str(tmp_path / "store")!r})
      program_store.enable(store)
      def f(x, *, k):
        return jnp.sort(x)[::-1][:k] * 2.0 + jnp.exp(x).sum()
      x = np.array([3.0, 1.0, 2.0, 0.5], np.float32)
      want = np.asarray(jax.jit(f, static_argnames="k")(x, k=3))
      def run():
        return np.asarray(program_store.StoredJit(f, ("k",))(x, k=3))
      assert np.array_equal(run(), want)
      [path] = store.glob("*.bin"); path.unlink()       # the store loses it; JAX's cache keeps it
      hits = getattr(program_store._hits, "count", 0)
      assert np.array_equal(run(), want)
      assert program_store._hits.count == hits + 1      # JAX's cache handed it over ...
      [path] = store.glob("*.bin")                      # ... and a fresh compile was stored
      assert np.array_equal(run(), want)
      assert np.array_equal(program_store._load(path)(x), want)
      print("ok")
  """)
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("JAX_COMPILATION_CACHE_DIR", None)
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                        timeout=120)
  assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_above_its_size_the_store_drops_the_programs_used_least_recently(tmp_path):
  for i, age in enumerate([50, 10, 40, 30]):  # (seconds since last used)
    path = tmp_path / f"p{i}.bin"
    path.write_bytes(b"x" * 100)
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime - age))
  program_store._trim(tmp_path, most=400)
  assert len(list(tmp_path.glob("*.bin"))) == 4  # (not above it: all kept)
  program_store._trim(tmp_path, most=399)  # -> at most 299 bytes: the two least recent go
  assert sorted(p.name for p in tmp_path.glob("*.bin")) == ["p1.bin", "p3.bin"]


def test_preloading_reads_a_stored_program_without_running_it_and_the_call_runs_that(store):
  x, y = np.ones((2, 3), np.float32), np.ones((4,), np.float32)
  StoredJit(scaled_sum, ("scale",))(x, y, scale=2.0)
  later = StoredJit(scaled_sum, ("scale",))  # (a new process)
  like = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, y)]
  assert later.preload(jax.ShapeDtypeStruct((3, 3), np.float32), like[1], scale=2.0) is None
  out = later.preload(*like, scale=2.0)
  assert out[0].shape == (2, 3) and out[1]["max"].shape == ()
  for path in store.glob("*.bin"):  # (the call runs what was preloaded: no file needed)
    path.unlink()
  np.testing.assert_array_equal(later(x, y, scale=2.0)[0], np.full((2, 3), 6.0))
  assert TRACES == [(2, 3)] and not list(store.glob("*.bin"))


def test_a_folder_that_refuses_writes_turns_the_store_off_with_one_warning(store, caplog,
                                                                           monkeypatch):
  def refuse(*_):
    raise PermissionError(13, "Permission denied", str(store))
  monkeypatch.setattr(program_store, "_save", refuse)
  program = StoredJit(scaled_sum, ("scale",))
  for n in (2, 3):  # (two programs: one warning)
    out = program(np.ones((n, 2), np.float32), np.ones(1, np.float32), scale=2.0)
    np.testing.assert_array_equal(out[0], np.full((n, 2), 3.0))
  assert program_store.folder() is None and caplog.text.count("program store is off") == 1
