"""config.model.dtype="auto": bf16 where the hardware multiplies it faster, f32 elsewhere, decided
by the accelerator's compute capability, the CPU flags and a cached probe (simulated here; the
real probe runs once), and an explicit dtype wins."""

import json

import pytest

from transformer_jax.parallel import hardware, numerics

AVX2 = frozenset({"fpu", "sse2", "avx", "avx2", "fma"})
AVX512_BF16 = AVX2 | {"avx512f", "avx512bw", "avx512_bf16"}


def never_called():
  raise AssertionError("the probe ran")


def test_without_native_bf16_the_choice_is_f32_and_nothing_is_measured(tmp_path):
  choice = numerics.choose("cpu", "AMD EPYC", AVX2, never_called, tmp_path / "cache.json")
  assert choice.dtype == "float32"
  assert "no native bf16" in choice.reason and "avx2 fma" in choice.reason
  assert not (tmp_path / "cache.json").exists()


@pytest.mark.parametrize("speedup, dtype", [(0.7, "float32"), (1.1, "float32"),
                                            (1.9, "bfloat16")])
def test_with_native_bf16_the_probe_decides(tmp_path, speedup, dtype):
  choice = numerics.choose("cpu", "AMD EPYC", AVX512_BF16, lambda: speedup, tmp_path / "c.json")
  assert choice.dtype == dtype
  assert f"{speedup:.2f}x" in choice.reason and "measured now" in choice.reason


def test_the_probe_is_cached_per_machine_and_a_damaged_cache_is_measured_again(tmp_path):
  cache = tmp_path / "numerics.json"
  calls = []

  def probe():
    calls.append(1)
    return 0.6  # bf16 emulated: slower than f32
  assert numerics.choose("cpu", "EPYC", AVX512_BF16, probe, cache).dtype == "float32"
  again = numerics.choose("cpu", "EPYC", AVX512_BF16, never_called, cache)
  assert again.dtype == "float32" and "cached" in again.reason
  assert numerics.choose("cpu", "other CPU", AVX512_BF16, probe, cache).dtype == "float32"
  assert len(calls) == 2 and len(json.loads(cache.read_text())) == 2  # one entry per machine
  cache.write_text("{not json")
  assert numerics.choose("cpu", "EPYC", AVX512_BF16, lambda: 2.0, cache).dtype == "bfloat16"
  assert len(json.loads(cache.read_text())) == 1


def test_the_xla_flags_are_part_of_the_machine(monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  plain = numerics.machine_key("EPYC", AVX512_BF16)
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_xnnpack=false")
  assert numerics.machine_key("EPYC", AVX512_BF16) != plain


@pytest.mark.parametrize("backend,capability,dtype", [
    ("tpu", "", "bfloat16"),
    ("gpu", "9.0", "bfloat16"), ("gpu", "8.0", "bfloat16"), ("gpu", "8.6", "bfloat16"),  # H100
    ("gpu", "7.5", "float32"), ("gpu", "7.0", "float32"), ("gpu", "6.0", "float32"),  # T4 V100 P100
    ("gpu", "", "float32"),  # unknown
    ("rocm", "gfx90a", "bfloat16"), ("gpu", "gfx942", "bfloat16"), ("gpu", "gfx1030", "float32")])
def test_accelerators_take_bf16_only_where_they_multiply_it_natively(backend, capability, dtype,
                                                                     tmp_path):
  choice = numerics.choose(backend, "", frozenset(), never_called, tmp_path / "c",
                           capability=capability)
  assert choice.dtype == dtype and choice.reason  # (the reason is logged)
  assert not (tmp_path / "c").exists()


def test_arm_cpus_with_bf16_are_measured_and_those_without_take_f32(tmp_path):
  neoverse = frozenset({"fp", "asimd", "sve", "i8mm", "bf16"})
  assert numerics.choose("cpu", "", neoverse, lambda: 2.0, tmp_path / "c").dtype == "bfloat16"
  assert numerics.choose("cpu", "", frozenset({"fp", "asimd"}), never_called,
                         tmp_path / "d").dtype == "float32"


def test_the_real_probe_gives_a_sane_ratio_as_the_median_of_its_repeats():
  speedup = numerics.probe_bf16_speedup(n=256, reps=2)  # (small: the figure, not its accuracy)
  assert 0.01 < speedup < 50.0


def test_the_probes_figures_go_under_xdg_cache_home(tmp_path, monkeypatch):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
  numerics.choose("cpu", "EPYC", AVX512_BF16, lambda: 2.0)
  cached = json.loads((tmp_path / "transformer_jax" / "numerics.json").read_text())
  assert [entry["bf16_speedup"] for entry in cached.values()] == [2.0]


def test_unknown_cpus_are_measured(tmp_path):
  unknown = numerics.choose("cpu", "", frozenset(), lambda: 1.5, tmp_path / "c")
  assert unknown.dtype == "bfloat16" and "flags are unknown" in unknown.reason


def test_an_explicit_or_recorded_dtype_wins(monkeypatch):
  monkeypatch.setattr(numerics, "choose", lambda *a, **k: pytest.fail("chose anew"))
  assert numerics.resolve("float32").dtype == "float32"
  assert numerics.resolve("bfloat16", recorded="float32").dtype == "bfloat16"
  recorded = numerics.resolve("auto", recorded="float32")
  assert recorded.dtype == "float32" and "config.json" in recorded.reason


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
  info = tmp_path / "cpuinfo"
  info.write_text("processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu avx2 fma avx512f"
                  " avx512_bf16\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 7B13\nflags\t\t: x\n")
  model, flags = hardware.cpu_info(str(info))
  assert model == "AMD EPYC 7B13" and "avx512_bf16" in flags and "x" not in flags
  assert hardware.isa_summary(flags) == "avx2 fma avx512f avx512_bf16"
  assert hardware.cpu_info(str(tmp_path / "missing")) == ("", frozenset())
