"""Prints a BENCHMARKS.md entry for a finished training run, from the files it wrote.

  python benchmarks/report_run.py runs/default --command "make demo" --wall-seconds 1650
"""

import argparse
import datetime
import json
import subprocess
from pathlib import Path

from transformer_jax.parallel import hardware


def main():
  p = argparse.ArgumentParser()
  p.add_argument("workdir")
  p.add_argument("--command", required=True)
  p.add_argument("--wall-seconds", type=float, required=True, help="measured by the caller")
  p.add_argument("--wall-includes", default="install, tokenizer, data preparation, training, "
                 "evaluations and test", help="what the wall time covers")
  args = p.parse_args()
  workdir = Path(args.workdir)
  config = json.loads((workdir / "config.json").read_text())
  split = config["data"]["test_split"]
  # training's final test: the newest record of eval/<test split>/results.json
  test = json.loads((workdir / "eval" / split / "results.json").read_text())[-1]
  records = [json.loads(x) for x in (workdir / "metrics.jsonl").read_text().splitlines()]
  evals = [(r["step"], r["eval/bleu"]) for r in records if "eval/bleu" in r]
  speeds = [r["perf/tokens_per_sec"] for r in records if "perf/tokens_per_sec" in r]
  decode = [r["perf/test_decode_sentences_per_sec"] for r in records
            if "perf/test_decode_sentences_per_sec" in r]
  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  print(f"- date: {datetime.date.today()}; commit {commit}; machine: "
        f"{hardware.describe_machine()}; dtype {config['model']['dtype']}")
  print(f"- command: `{args.command}`; wall time {args.wall_seconds / 60:.1f} min "
        f"({args.wall_includes} included)")
  print(f"- test ({split}, step {test['steps'][-1]}, beam {test['decode']['beam_size']}, "
        f"alpha {test['decode']['length_penalty']}): **sacreBLEU {test['bleu']:.2f}**, "
        f"chrF {test['chrf']:.2f}")
  print(f"  - BLEU signature: `{test['bleu_signature']}`")
  print("- validation BLEU by step: " + ", ".join(f"{s}: {b:.2f}" for s, b in evals))
  if speeds:
    print(f"- training speed: median {sorted(speeds)[len(speeds) // 2]:,.0f} real src+tgt "
          f"tokens/s")
  if decode:
    print(f"- test decoding: {decode[-1]:.1f} sentences/s (beam {test['decode']['beam_size']})")
  if (workdir / "plan.json").is_file():  # (a planned run: what it chose, and how it went)
    plan = json.loads((workdir / "plan.json").read_text())
    took = [r["time/run_minutes"] for r in records if "time/run_minutes" in r]
    print(f"- plan: {plan['num_train_steps']:,} steps at {plan['seconds_per_step']:.3f} s "
          f"(measured), subword sampling alpha {plan['sampling_alpha']:g}, validation every "
          f"{plan['eval_every_steps']:,} steps, {plan['seconds_before']:.0f} s before it; "
          f"planned for {plan['minutes']:g} minutes"
          + (f", the training command took {took[-1]:.1f}" if took else ""))


if __name__ == "__main__":
  main()
