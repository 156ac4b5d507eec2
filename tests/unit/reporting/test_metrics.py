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


def test_a_resumed_writer_hides_the_redone_steps_from_tensorboard(tmp_path):
  """As TensorBoard reads them: steps 1-4 written, the run resumed from step 2 writes 3-4
  again; each step has one value, the later run's."""
  from tensorboard.backend.event_processing import event_accumulator

  first = metrics.MetricWriter(tmp_path)
  for step in (1, 2, 3, 4):
    first.write(step, {"train/loss": float(step)})
  first.close()
  resumed = metrics.MetricWriter(tmp_path, resumed_at=2)
  for step in (3, 4):
    resumed.write(step, {"train/loss": 10.0 * step})
  resumed.close()

  events = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
  events.Reload()
  assert [(e.step, e.value) for e in events.Scalars("train/loss")] == [
      (1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_a_writer_opened_as_the_second_turns_still_sorts_before_the_resumed_one(
    tmp_path, monkeypatch):
  """The event file's second is read after our suffix: with a suffix of the fraction alone, a
  writer opened at x.9999 s (its file named x+1) sorted after one opened at x+1.0002 (CI saw the
  resumed run's values hidden by the first run's)."""
  import time
  now = [1000.9999]
  monkeypatch.setattr(time, "time_ns", lambda: int(now[0] * 1e9))
  monkeypatch.setattr(time, "time", lambda: now[0] + 0.0001)  # (a moment later)
  first = metrics.MetricWriter(tmp_path)
  first.close()
  now[0] = 1001.0002
  resumed = metrics.MetricWriter(tmp_path, resumed_at=2)
  resumed.close()
  files = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
  assert [f.split(".")[3] for f in files] == ["1001", "1001"]  # (the same second)
  assert files[0].endswith(f"{int(1000.9999e9):020d}")
