"""`compare` on runs compares like with like: each run's translations made by the same engine,
the same checkpoint selection and the same decoding settings as the first run's (results.json
says which), or it refuses naming what differs; it prints what it compared."""

import dataclasses
import json

from tests import helpers
from tests.helpers import run_tool
from transformer_jax.cli import compare
from transformer_jax.workdir import layout

REFERENCES = ["a dog runs", "two cats sleep", "a man reads a book", "a woman walks"]


def _evaluated(workdir, *results):
  """A run's eval/test2016/ as evaluate writes it: a .hyp and a results.json record per
  (label, engine or None, decode overrides), in the order evaluated."""
  folder = layout.eval_dir(workdir, "test2016")
  folder.mkdir(parents=True)
  records = []
  for label, engine, decode in results:
    layout.write_lines(folder / f"{label}.hyp", [f"{label} {r}" for r in REFERENCES])
    record = {"label": label, "steps": [300], "data": "test2016",
              "decode": dataclasses.asdict(helpers.section("decode", **decode))}
    records.append({**record, "engine": engine} if engine else record)
  (folder / "results.json").write_text(json.dumps(records))
  return workdir


def test_each_run_gives_the_translations_made_as_the_baselines_were(tmp_path):
  ref = tmp_path / "ref.txt"
  layout.write_lines(ref, REFERENCES)
  # (the baseline's last evaluated: our search; the system's: CTranslate2, after ours)
  base = _evaluated(tmp_path / "base", ("step_500_ema", None, {}))
  new = _evaluated(tmp_path / "new", ("step_300_ema", None, {"batch_size": 64}),
                   ("step_300_ema@ctranslate2", "ctranslate2", {}))
  status, out, err = run_tool(compare.main, f"--baseline={base}", f"--system={new}",
                              f"--reference={ref}", f"--json={tmp_path / 'report.json'}")
  assert status == 0, err
  lines = out.splitlines()
  assert f"{new}: {new}/eval/test2016/step_300_ema.hyp" in lines  # (batch size aside)
  assert lines[1:4] == [
      lines[1], f"{base}: {base}/eval/test2016/step_500_ema.hyp",
      f"{new}: {new}/eval/test2016/step_300_ema.hyp"]
  assert lines[1].startswith("translations made alike: engine jax, checkpoint step_N (ema "
                             "weights), decoding beam_size=2 ")
  report = json.loads((tmp_path / "report.json").read_text())
  assert report["made_by"]["engine"] == "jax" and report["made_by"]["checkpoint"] == "step_N"


def test_a_run_without_translations_made_alike_is_refused_naming_what_differs(tmp_path):
  ref = tmp_path / "ref.txt"
  layout.write_lines(ref, REFERENCES)
  ct2 = _evaluated(tmp_path / "ct2", ("step_300_ema@ctranslate2", "ctranslate2", {}))
  ours = _evaluated(tmp_path / "ours", ("step_300_ema", None, {}))
  wider = _evaluated(tmp_path / "wider", ("best_step_300_ema", None, {}),
                     ("step_300_ema", None, {"beam_size": 4}))
  for baseline, system, differs in [
      (ct2, ours, "step_300_ema differs in engine jax (not ctranslate2)"),
      (ours, wider, "step_300_ema differs in beam_size=4 (not 2)")]:
    status, _, err = run_tool(compare.main, f"--baseline={baseline}", f"--system={system}",
                              f"--reference={ref}")
    line = helpers.one_line_error(err)
    assert status == 1 and line.startswith(
        f"compare: {system}/eval/test2016 has no translations made alike (engine "), line
    assert differs in line and "compare the .hyp files themselves" in line
  status, _, err = run_tool(compare.main, f"--baseline={ours}", f"--system={wider}",
                            "--label=step_300_ema", f"--reference={ref}")  # (named: the same)
  assert status == 1 and "beam_size=4 (not 2)" in helpers.one_line_error(err)
