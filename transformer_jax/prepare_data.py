"""Prepares a config's data once, ahead of training: the TFDS datasets and the tokenizer.

  python -m transformer_jax.prepare_data --config=configs/wmt_base.py --workdir=runs/wmt_base

Training does the same on first use; running it apart is for big corpora and many hosts: prepare
WMT into a shared `config.data.cache_dir` and train the tokenizer into the shared workdir on one
machine, then start every host's `train.py` with the same flags (they read, nothing is
written twice). Prints each split's size and the tokenizer's pieces.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "The run's workdir: the tokenizer goes to <workdir>/spm.model "
                    "(or config.data.tokenizer_path).")
config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
flags.mark_flags_as_required(["config", "workdir"])


def prepare(cfg, workdir: str | Path):
  """Prepares every dataset the config reads and its tokenizer; returns the split sizes and
  the tokenizer."""
  from transformer_jax import corpus, train_lib
  d = cfg.data
  sizes = {}
  for dataset in dict.fromkeys([d.dataset, d.eval_dataset or d.dataset,
                                d.test_dataset or d.dataset]):
    spec = d.corpus_spec(dataset)
    builder = corpus.get_builder(spec)
    for split in spec.splits:
      sizes[f"{dataset}:{split}"] = len(builder.as_data_source(split=split))
  return sizes, train_lib.load_tokenizer(cfg, Path(workdir))


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  from transformer_jax import config as config_lib, corpus, metrics
  metrics.log_to_stderr()
  metrics.quiet_libraries()
  start = time.perf_counter()
  try:
    cfg = config_lib.from_config_dict(FLAGS.config)
    sizes, tok = prepare(cfg, FLAGS.workdir)
  except config_lib.ConfigError as e:
    sys.exit(f"config error: {e}")
  except corpus.DataError as e:
    sys.exit(f"error: {e}")
  for name, size in sizes.items():
    print(f"{name}: {size:,} pairs")
  print(f"tokenizer: {tok.path} ({tok.vocab_size:,} pieces); "
        f"prepared in {time.perf_counter() - start:.0f} s")


def run():
  app.run(main)


if __name__ == "__main__":
  run()
