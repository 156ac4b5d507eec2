"""Peak memory of the Beam preparation (DirectRunner, 2 worker processes) against corpus size.

  python benchmarks/beam_memory.py --pairs=20000      # then --pairs=200000 (10x), compare

Writes `--pairs` gzipped Multi30k pairs (numbered, so that none repeats) to a temporary folder
and prepares them with `data.apache_beam_prep.beam_writer` and the cleaning rules of the Beam test
(duplicates included), then prints the seconds and the peak resident memory of this process
(DirectRunner's driver) and of its largest worker. Run each size in its own process.
"""

import gzip
import resource
import shutil
import tempfile
import time
from pathlib import Path

from absl import app, flags

from transformer_jax.config.corpora import CleaningConfig
from transformer_jax.data import corpus
from transformer_jax.data.apache_beam_prep import beam_writer
from transformer_jax.parallel import hardware

FLAGS = flags.FLAGS
flags.DEFINE_integer("pairs", 20_000, "Training pairs.")
flags.DEFINE_integer("lines_per_shard", 10_000, "Input lines per Beam task.")
RULES = CleaningConfig(empty=True, max_words=20, max_length_ratio=2.5, identical=True,
                       duplicates=True, min_letter_fraction=0.5, examples=3)


def main(_):
  work = Path(tempfile.mkdtemp(prefix="beam_memory_"))
  src = work / "src"
  src.mkdir()
  for lang in ("de", "en"):
    lines = list(corpus.read_lines(corpus.EMBEDDED_MULTI30K / f"train.{lang}.gz"))
    with gzip.open(src / f"train.{lang}.gz", "wt", encoding="utf-8") as f:
      f.writelines(f"{lines[i % len(lines)]} {i}\n" for i in range(FLAGS.pairs))
    with gzip.open(src / f"val.{lang}.gz", "wt", encoding="utf-8") as f:
      f.writelines(line + "\n" for line in lines[:20])
  writer = beam_writer(options=["--direct_num_workers=2",
                                "--direct_running_mode=multi_processing"],
                       lines_per_shard=FLAGS.lines_per_shard)
  start = time.time()
  corpus.prepare_local(src, ("train", "val"), ("de", "en"), str(work / "cache"), cleaning=RULES,
                       clean_split="train", write_splits=writer)
  mib = lambda who: resource.getrusage(who).ru_maxrss / 1024  # noqa: E731
  print(f"machine: {hardware.describe_machine()}; {FLAGS.pairs:,} pairs in "
        f"{time.time() - start:.1f} s; peak RSS: driver {mib(resource.RUSAGE_SELF):.0f} MiB, "
        f"largest worker {mib(resource.RUSAGE_CHILDREN):.0f} MiB")
  shutil.rmtree(work)


if __name__ == "__main__":
  app.run(main)
