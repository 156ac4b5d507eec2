"""A test set's n-best lists and scores from a trained run, as JSON, to compare two versions of
the code (same run, same machine): run it from each checkout, then compare the files.

  python benchmarks/nbest_dump.py --workdir=RUN --mode=beam --out=new_beam.json
  (cd /tmp/before && PYTHONPATH=. python /path/to/benchmarks/nbest_dump.py --workdir=RUN \
      --mode=beam --out=old_beam.json)
  python benchmarks/nbest_dump.py --compare=old_beam.json,new_beam.json

`--mode=beam`: beam 4 with its 4-best; `greedy`: greedy decoding; f32 (`--dtype=float32`), the
run's test split. The comparison prints the sentences whose n-best lists (text and ids)
differ and the largest score difference. Uses only `Translator`'s public interface, so an
older checkout runs it too.
"""

import json
import sys
import time

from absl import app, flags

from transformer_jax.data.eval_sets import load_eval_set
from transformer_jax.inference.translator import Translator

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", "", "A trained workdir.")
flags.DEFINE_enum("mode", "beam", ["beam", "greedy"], "Beam 4 (its 4-best) or greedy.")
flags.DEFINE_string("out", "", "Where the JSON goes.")
flags.DEFINE_string("checkpoint", "latest", "Checkpoint selection.")
flags.DEFINE_string("compare", "", "Two JSON files (A,B) to compare instead.")


def compare(first: str, second: str):
  a, b = (json.load(open(path)) for path in (first, second))
  assert len(a) == len(b), (len(a), len(b))
  differ = sum(1 for x, y in zip(a, b) if [(h[0], h[2]) for h in x] != [(h[0], h[2]) for h in y])
  largest = max((abs(h[1] - g[1]) for x, y in zip(a, b) for h, g in zip(x, y)), default=0.0)
  print(f"{len(a)} sentences, {sum(map(len, a))} hypotheses: n-best lists differing {differ}, "
        f"largest score difference {largest:.2e}")


def main(_):
  if FLAGS.compare:
    compare(*FLAGS.compare.split(","))
    return
  overrides = ["beam_size=4", "nbest=4"] if FLAGS.mode == "beam" else ["greedy=True"]
  translator = Translator(FLAGS.workdir, FLAGS.checkpoint, overrides, dtype="float32")
  data = translator.run.cfg.data
  sources = load_eval_set(data, data.test_split, translator.run.tokenizer,
                          dataset=data.test_dataset).sources
  start = time.time()
  results = translator.translate(sources)
  print(f"{FLAGS.mode}: {len(sources)} sentences in {time.time() - start:.1f} s", file=sys.stderr)
  with open(FLAGS.out, "w") as f:
    json.dump([[(h.text, h.score, list(h.ids), h.ended) for h in hyps] for hyps in results], f)


if __name__ == "__main__":
  app.run(main)
