"""Splits a parallel corpus folder's training pairs into two random halves A and B (the
back-translation experiment of BENCHMARKS.md): A and B get `train.{lang}.gz` of their half
and a copy of every other split, so each is a corpus folder of its own.

  python benchmarks/halves.py SRC_FOLDER OUT_FOLDER [--langs de,en] [--seed 0]
"""

import argparse
import gzip
import random
import shutil
from pathlib import Path

from transformer_jax.data import corpus


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("src")
  parser.add_argument("out")
  parser.add_argument("--langs", default="de,en")
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  langs = tuple(args.langs.split(","))
  src, out = Path(args.src), Path(args.out)
  pairs = [p[1:] for p in corpus.read_parallel(src, "train", langs)]
  order = list(range(len(pairs)))
  random.Random(args.seed).shuffle(order)
  halves = {"A": sorted(order[:len(order) // 2]), "B": sorted(order[len(order) // 2:])}
  for name, indices in halves.items():
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    for side, lang in enumerate(langs):
      with gzip.open(folder / f"train.{lang}.gz", "wt", encoding="utf-8") as f:
        f.writelines(pairs[i][side] + "\n" for i in indices)
    for path in src.iterdir():  # (the other splits, as they are)
      if not path.name.startswith("train.") and path.name != "SOURCE.md":
        shutil.copy(path, folder / path.name)
    print(f"{folder}: {len(indices)} training pairs")


if __name__ == "__main__":
  main()
