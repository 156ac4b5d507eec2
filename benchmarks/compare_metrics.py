"""Compares the metrics.jsonl of two runs value by value, bit for bit, except timings
(`perf/*_per_sec`, `time/*`): the check that a change left what training computes unchanged.

  python benchmarks/compare_metrics.py runs/before/metrics.jsonl runs/after/metrics.jsonl

Prints the number of records and "identical", or each record that differs; exits 1 then.
"""

import argparse
import json
import sys


def records(path: str) -> list[dict]:
  with open(path, encoding="utf-8") as f:
    return [{k: v for k, v in json.loads(line).items()
             if not (k.endswith("_per_sec") or k.startswith("time/"))}
            for line in f if line.strip()]


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("before")
  parser.add_argument("after")
  args = parser.parse_args()
  a, b = records(args.before), records(args.after)
  values = sum(len(r) - 1 for r in a)
  if a == b:
    print(f"{len(a)} records, {values} values: identical")
    return
  print(f"{len(a)} vs {len(b)} records: different")
  for x, y in zip(a, b):
    if x != y:
      print(f"  before: {x}\n  after:  {y}")
  sys.exit(1)


if __name__ == "__main__":
  main()
