"""train.py on the tiny config: outputs, metrics, resume (exactly where it stopped)."""

import json
import subprocess
import sys

from tests.conftest import ROOT


def _train(workdir, cache, *overrides):
  cmd = [sys.executable, "train.py", "--config=configs/tiny.py", f"--workdir={workdir}",
         f"--config.data.cache_dir={cache}", *overrides]
  r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-4000:]
  return r


def _metrics(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_train_writes_its_outputs_and_resumes_exactly(tmp_path):
  cache = tmp_path / "tfds"
  full = tmp_path / "full"
  _train(full, cache)
  records = _metrics(full)
  keys = set().union(*records)
  for key in ("train/loss", "eval/loss", "eval/bleu", "perf/tokens_per_sec"):
    assert key in keys
  assert all("step" in r for r in records)
  assert (full / "config.json").is_file() and (full / "spm.model").is_file()
  assert json.loads((full / "config.json").read_text())["model"]["d_model"] == 32
  assert sorted(p.name for p in (full / "checkpoints").iterdir() if p.name.isdigit()) == \
      ["10", "20"]
  assert (full / "metrics.png").is_file()
  losses = [r["train/loss"] for r in records if "train/loss" in r]
  assert losses[-1] < losses[0]

  # Stop at step 10, then run the same command to 20: it resumes and ends where the
  # uninterrupted run ended (same parameters -> same loss at step 20, to the last bit).
  split = tmp_path / "split"
  _train(split, cache, "--config.num_train_steps=10")
  r = _train(split, cache)
  assert "Resuming from step 10" in r.stderr
  resumed = _metrics(split)
  last = lambda recs, key: [x[key] for x in recs if key in x and x["step"] == 20][-1]
  assert last(resumed, "train/loss") == last(records, "train/loss")
  assert last(resumed, "eval/loss") == last(records, "eval/loss")

  # Running it again once finished trains no further step.
  r = _train(split, cache)
  assert "Resuming from step 20" in r.stderr
  assert max(x["step"] for x in _metrics(split)) == 20
