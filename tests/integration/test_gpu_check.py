"""benchmarks/gpu_check.py runs end to end on CPU with the tiny shape, so that it is known to
work before a GPU sees it: every check reports, none fails, and the variants agree."""

import json
import subprocess
import sys

from tests import helpers


def test_gpu_check_runs_on_cpu_with_the_tiny_shape(tmp_path):
  r = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--tiny", "--steps=2",
                      f"--out={tmp_path}"], cwd=helpers.ROOT, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  printed = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
  written = [json.loads(line) for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()]
  assert printed == written
  assert [x["check"] for x in written] == ["machine", "matmul_peak"] + ["train_step"] * 6 + [
      "population", "engine", "decode", "determinism"]
  assert not [x for x in written if "error" in x]
  by_check = {x["check"]: x for x in written}
  assert by_check["machine"]["backend"] == "cpu" and "cores" in by_check["machine"]["cpu"]
  assert by_check["matmul_peak"]["bf16_gflops"] > 0 and by_check["matmul_peak"]["f32_gflops"] > 0
  trained = [x for x in written if x["check"] == "train_step"]
  steps = {(x["attention_impl"], x["loss_tile_tokens"], x["activation_dtype"]): x
           for x in trained[:4]}
  assert set(steps) == {("einsum", 256, "auto"), ("xla", 256, "auto"), ("xla", 256, "float32"),
                        ("xla", 0, "auto")}
  assert [x["repeat"] for x in trained] == [False] * 4 + [True, False]
  assert trained[4]["attention_impl"] == "einsum" and trained[5]["config"].startswith(
      "d_model 64")  # (the first variant again; then the wider model standing for wmt_big)
  assert all(s["tokens_per_s"] > 0 for s in trained)
  assert all(s["effective_loss_tile"] == s["loss_tile_tokens"] for s in trained)  # (CPU's)
  assert all(s["predicted_step_ms"] is None for s in trained)  # (no GPU of the targets)
  first = steps["einsum", 256, "auto"]["loss"]
  assert all(abs(s["loss"] - first) < 1e-2 * first for s in trained[:5])
  runs = by_check["population"]["runs"]
  assert [r["members"] for r in runs] == ["single run", 1, 2]
  assert all(r["step_ms"] > 0 for r in runs) and runs[1]["vs_single_runs"] > 0
  engine = by_check["engine"]
  assert engine["sentences"] == 16 and engine["first_decode_s"] > 0
  assert engine["warm_sentences_per_s"] > 0
  assert by_check["decode"]["dtype"] == "float32"  # (exact agreement holds in f32)
  decodes = by_check["decode"]["runs"]
  assert [(r["beam_impl"], r["sentences"]) for r in decodes] == [
      ("gather", 4), ("flat", 4), ("gather", 8), ("flat", 8)]
  assert all(r["sentences_per_s"] > 0 for r in decodes)
  assert all(r["same_best_as_gather"] == 1.0 for r in decodes if r["beam_impl"] == "flat")
  assert by_check["determinism"]["bit_identical"] is True  # CPU steps are deterministic
