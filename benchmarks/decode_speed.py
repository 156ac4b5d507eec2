"""Beam-search decoding speed of a trained run on a split: sentences/s, cold and warm.

  python benchmarks/decode_speed.py --workdir=runs/default [--split=test2016] [--beam_size=4]

Cold includes compiling one program per batch shape; warm reruns the same batches. The
whole search (encoder, cached decoder steps, beam bookkeeping) is one compiled program per
batch shape: there is no per-token Python dispatch.
"""

import dataclasses
import platform
import sys
import time
from pathlib import Path

from absl import app, flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transformer_jax import data, decode, evaluate, inference  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A trained workdir.")
flags.DEFINE_string("split", "", "Split to decode (default: the config's test split).")
flags.DEFINE_integer("beam_size", 4, "Beam size.")
flags.DEFINE_string("checkpoint", "latest", "Checkpoint selection.")
flags.mark_flag_as_required("workdir")


def main(_):
  run = inference.load_run(FLAGS.workdir)
  (_, steps, from_best), = run.select(FLAGS.checkpoint)
  params = run.params(steps, from_best)
  split = FLAGS.split or run.cfg.data.test_split
  eval_set = data.load_eval_set(run.cfg.data, split, run.tokenizer,
                                dataset=run.cfg.data.test_dataset)
  cfg = dataclasses.replace(run.cfg.decode, beam_size=FLAGS.beam_size)
  timings = []
  for _ in range(2):
    t = time.perf_counter()
    hyps = decode.translate(run.model, params, eval_set, run.tokenizer, cfg, run.mesh)
    timings.append(time.perf_counter() - t)
  bleu = evaluate.score(hyps, eval_set.references)
  print(f"machine: {platform.machine()}, {run.mesh.devices.size} device(s)")
  print(f"{split}: {len(hyps)} sentences, beam {cfg.beam_size}, batch {cfg.batch_size}, "
        f"alpha {cfg.length_penalty}")
  print(f"cold (with compilation): {len(hyps) / timings[0]:.1f} sentences/s "
        f"({timings[0]:.1f} s)")
  print(f"warm: {len(hyps) / timings[1]:.1f} sentences/s ({timings[1]:.1f} s)")
  print(f"BLEU {bleu.bleu:.2f} ({bleu.bleu_signature})")


if __name__ == "__main__":
  app.run(main)
