"""Our beam search against the run exported to CTranslate2 (float32 and int8): test BLEU and
sentences/s on this machine, the same run, alternating rounds; and the export's agreement
(greedy translations equal, beam BLEU at the same length cap, float32 on both sides).

  python benchmarks/export_speed.py --workdir=runs/default [--checkpoint=latest] [--rounds=3] \
      [--decode=beam_impl=flat]

Both decode through the one engine protocol (`decoding.engine`), as
`transformer-jax-translate` does: ours with the run's dtype and decoding settings (with
`--decode`'s overrides), CTranslate2 with those settings as it honours them
(`interop.engines.Ctranslate2Engine`), timed at one length cap for all (the largest, one
`translate_batch` call: its fastest) and, in a row of its own, at our per-sentence caps (a
call per cap, as the engine honours them), on all cores (one translator; int8's rounds after
the others).
Sentences/s is the median round's, warm (our first, compiling round is reported apart).
Prints a BENCHMARKS.md entry.
"""

import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ctranslate2
import sacrebleu
from absl import app, flags

from transformer_jax.data.eval_sets import load_eval_set
from transformer_jax.inference.translator import Translator
from transformer_jax.interop import ctranslate2_decoding
from transformer_jax.interop.ctranslate2_export import export
from transformer_jax.interop.engines import Ctranslate2Engine
from transformer_jax.parallel import compilation, hardware

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A trained workdir.", required=True)
flags.DEFINE_string("checkpoint", "latest", "Checkpoint selection.")
flags.DEFINE_string("split", "", "Split to translate (default: the run's test split).")
flags.DEFINE_integer("rounds", 3, "Timed rounds of each system (alternating).")
flags.DEFINE_multi_string("decode", [], "Our search's config.decode overrides (KEY=VALUE), "
                          "e.g. beam_impl=flat.")


def _timed(fn):
  t = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - t


def _bleu(hyps, refs) -> float:
  return sacrebleu.corpus_bleu(hyps, [refs]).score


def main(_):
  checkpoint = FLAGS.checkpoint
  ours = Translator(FLAGS.workdir, checkpoint, FLAGS.decode)
  run = ours.run
  split = FLAGS.split or run.cfg.data.test_split
  eval_set = load_eval_set(run.cfg.data, split, run.tokenizer, dataset=run.cfg.data.test_dataset)
  sources, refs = eval_set.sources, eval_set.references
  folders = {}
  tmp = Path(tempfile.mkdtemp(prefix="export_speed_"))
  for quantization in ("float32", "int8"):
    folders[quantization] = tmp / quantization
    _, seconds = _timed(lambda q=quantization: export(FLAGS.workdir, checkpoint,
                                                      folders[q], q))
    print(f"exported {quantization} in {seconds:.1f} s "
          f"({(folders[quantization] / 'model.bin').stat().st_size / 2**20:.1f} MiB)",
          file=sys.stderr)
  options = ctranslate2_decoding.translate_options(ours.decode, run.cfg.model.max_len)

  def translator(quantization: str, decode=None) -> Ctranslate2Engine:
    return Ctranslate2Engine(folders[quantization], run.tokenizer, decode or ours.decode,
                             run.cfg.model.max_len, compute_type=quantization)

  def best(engine, decode=None):
    return [h[0].text if h else "" for h in engine.translate(sources, decode=decode)]

  def ours_fn():
    return _timed(lambda: best(ours.engine))

  def timed_translation(engine: Ctranslate2Engine, decode=None):
    return lambda: _timed(lambda: best(engine, decode))

  # (CTranslate2 timed at one cap for all, the largest, as `translate_batch` alone takes it:
  # its fastest; our per-sentence caps cost it a call per cap, timed apart)
  one_cap = dataclasses.replace(ours.decode, max_length_a=0.0,
                                max_length_b=ours.decode.max_length)

  # Ours and CTranslate2 float32 alternate; the int8 translator is made after their rounds:
  # once one has run, its threads stay in the process and slowed float32 by a quarter to a
  # third on 2 cores (measured; freeing the translator did not help).
  float32 = translator("float32")
  phases = [lambda: {f"ours ({run.cfg.model.dtype})": ours_fn,
                     "CTranslate2 float32": timed_translation(float32, one_cap),
                     "CTranslate2 float32, our caps": timed_translation(float32)},
            lambda: {"CTranslate2 int8": timed_translation(translator("int8"), one_cap)}]
  prepared = compilation.programs_prepared()
  _, cold = ours_fn()
  prepared = compilation.programs_prepared() - prepared
  times, outputs = {}, {}
  for make_phase in phases:
    phase = make_phase()
    for _ in range(FLAGS.rounds):
      for name, fn in phase.items():
        outputs[name], seconds = fn()
        times.setdefault(name, []).append(seconds)

  # Agreement, float32 on both sides at the same fixed length cap (as tests/integration).
  cap = ["max_length_a=0", f"max_length_b={ours.decode.max_length}"]
  agreement = {}
  for mode, decode in (("greedy", ["greedy=true"]), ("beam", [])):
    exact = Translator(FLAGS.workdir, checkpoint, [*decode, *cap], dtype="float32")
    mine = best(exact.engine)
    theirs = best(float32, exact.decode)
    agreement[mode] = (sum(a == b for a, b in zip(mine, theirs)), _bleu(mine, refs),
                       _bleu(theirs, refs))

  commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
  print(f"- machine: {hardware.describe_machine()}; {time.strftime('%Y-%m-%d %H:%M')}; commit "
        f"{commit}; ctranslate2 {ctranslate2.__version__} (intra_threads={os.cpu_count()})")
  print(f"- command: `python benchmarks/export_speed.py --workdir={FLAGS.workdir} "
        f"--checkpoint={checkpoint} --rounds={FLAGS.rounds}"
        f"{''.join(f' --decode={d}' for d in FLAGS.decode)}`; run's checkpoint "
        f"{ours.labels[0]}")
  print(f"- {split}: {len(sources)} sentences, beam {ours.decode.beam_size}, length penalty "
        f"{ours.decode.length_penalty} (ours GNMT, CTranslate2 length ** alpha), our cap "
        f"min({ours.decode.max_length}, {ours.decode.max_length_a} * source + "
        f"{ours.decode.max_length_b}), CTranslate2's {options['max_decoding_length']} for all "
        "(\"our caps\": ours, a call per cap)")
  print()
  print("| system | BLEU | chrF | sentences/s (median round) | rounds (s) |")
  print("|---|---|---|---|---|")
  for name, seconds in times.items():
    chrf = sacrebleu.corpus_chrf(outputs[name], [refs]).score
    print(f"| {name} | {_bleu(outputs[name], refs):.2f} | {chrf:.2f} | "
          f"{len(sources) / statistics.median(seconds):.1f} | "
          f"{', '.join(f'{s:.1f}' for s in seconds)} |")
  print()
  caches = "off" if os.environ.get(compilation.SWITCH) == "0" else "on"
  print(f"Our first round (compilation caches {caches}): {cold:.1f} s, {prepared} "
        f"programs compiled or loaded during it. Agreement (float32 on both sides, cap "
        f"{ours.decode.max_length} tokens): greedy translations equal on "
        f"{agreement['greedy'][0]}/{len(sources)} sentences (BLEU {agreement['greedy'][1]:.2f} "
        f"/ {agreement['greedy'][2]:.2f}); beam {ours.decode.beam_size} BLEU ours "
        f"{agreement['beam'][1]:.2f}, CTranslate2 {agreement['beam'][2]:.2f} (equal on "
        f"{agreement['beam'][0]}/{len(sources)}).")


if __name__ == "__main__":
  app.run(main)
