"""A table of finished training runs side by side, from the files they wrote: what each
changes against the first (config keys), its test-set sacreBLEU and chrF (training's final
test and every later `evaluate` of that set: EMA/raw weights, ensembles, MBR; a multilingual
run: each direction's test set), the best
validation BLEU, the steps trained, the median training tokens/s and the training minutes.

  python benchmarks/compare_runs.py runs/baseline runs/rotary runs/swiglu ...

Tokens/s are what each run logged: comparable only between runs on an otherwise idle machine
of one kind (the CPU is printed).
"""

import argparse
import json
import statistics
from pathlib import Path

from transformer_jax.parallel import hardware


def _flat(config: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in config.items():
    if isinstance(value, dict):
      out.update(_flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


IGNORED = ("data.cache_dir", "data.tokenizer_path")  # (where things are, not what is trained)


def _short(key: str) -> str:
  """A key as the table shows it: its last part, or a mixture corpus's `corpora.NAME.KEY`."""
  return key.removeprefix("data.") if key.startswith("data.corpora.") else key.split(".")[-1]


def changes(config: dict, reference: dict) -> str:
  """The config keys whose values differ from the reference run's, as key=value."""
  a, b = _flat(config), _flat(reference)
  diff = [f"{_short(k)}={a[k]}" for k in sorted(a)
          if k not in IGNORED and a.get(k) != b.get(k)]
  return ", ".join(diff) or "(the reference)"


def _search(result: dict) -> str:
  """The model and how it was decoded: label, beam or sampling, MBR."""
  d = result.get("decode", {})
  how = (f"sampling top_p={d['top_p']}" if d.get("sampling") else
         "greedy" if d.get("greedy") else f"beam {d.get('beam_size')}")
  if d.get("mbr"):
    how += f", MBR {d['mbr']} over {d['mbr_candidates']}"
  return f"{result['label']} ({how})"


def rows(workdir: Path, reference: dict) -> list[list[str]]:
  config = json.loads((workdir / "config.json").read_text())
  split = config["data"]["test_split"]
  records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines() if x]
  speeds = [r["perf/tokens_per_sec"] for r in records if "perf/tokens_per_sec" in r]
  evals = [r["eval/bleu"] for r in records if "eval/bleu" in r]
  minutes = max((r.get("time/train_minutes", 0.0) for r in records), default=0.0)
  steps = max((r["step"] for r in records), default=0)
  common = [f"{max(evals):.2f}" if evals else "", str(steps),
            f"{statistics.median(speeds):,.0f}" if speeds else "", f"{minutes:.1f}"]
  out = []
  sets = [split] + [f"{name}.{c['test_split']}" for name, c in
                    config["data"].get("corpora", {}).items() if c.get("test_split")]
  for name in filter(None, sets):  # (a multilingual run: each direction's test set too)
    results = workdir / "eval" / name / "results.json"
    for result in json.loads(results.read_text()) if results.is_file() else []:
      out.append([workdir.name, changes(config, reference), name, _search(result),
                  f"{result['bleu']:.2f}", f"{result['chrf']:.2f}", *common])
  return out


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("workdirs", nargs="+", type=Path)
  args = parser.parse_args()
  reference = json.loads((args.workdirs[0] / "config.json").read_text())
  print(f"machine: {hardware.describe_machine()}\n")
  header = ["run", "changes", "test set", "model", "test BLEU", "test chrF", "best val BLEU",
            "steps", "tokens/s", "train min"]
  print("| " + " | ".join(header) + " |")
  print("|" + "---|" * len(header))
  for workdir in args.workdirs:
    for row in rows(workdir, reference):
      print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
  main()
