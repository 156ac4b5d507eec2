"""metrics.jsonl: records read back, and cut to a restored step atomically on resume."""

import json

from transformer_jax.reporting import metrics


def test_truncating_keeps_the_records_up_to_the_restored_step(tmp_path):
  path = tmp_path / "metrics.jsonl"
  records = [{"step": s, "train/loss": 1.0 / s} for s in (5, 10, 15, 20)] + [
      {"step": 10, "eval/bleu": 3.0}]
  path.write_text("".join(json.dumps(r) + "\n" for r in records))
  kept = metrics.truncate_metrics(path, 10)
  assert [r["step"] for r in kept] == [5, 10, 10]
  assert metrics.read_metrics(path) == kept
  assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # (no temporary file left)
  assert metrics.truncate_metrics(tmp_path / "absent.jsonl", 3) == []
