"""Beam-search decoding speed: of a trained run on a split, or of the PyTorch peer's shape.

  python benchmarks/decode_speed.py --workdir=runs/default [--split=test2016] [--beam_size=4]

With `--workdir`: beam search, greedy and sampling (one sample, as back-translation draws)
over the split, cold and warm, with the work each did (program calls, steps at each width
class, resizes; the outputs' own lengths), then the MBR utilities over 16 samples of
`--mbr_sentences` sentences.
  python benchmarks/decode_speed.py --shape=small [--torch_python=/path/to/torch-venv/bin/python]

`--shape=small` decodes like ../shared/peers/torch_peer.py --mode decode: a randomly
initialised small model (d_model 256, 3+3 layers, 4 heads, FFN 1024, vocab 8000), 64 random
sources of 32 tokens, beam 4, alpha 0.6, exactly 32 new tokens (`min_len` = `max_len` = 32,
as Hugging Face's min_new_tokens = max_new_tokens = 32); sentences/s is the median of 5 warm
calls. With `--torch_python` the peer (Hugging Face `generate`) runs between our calls.
`--eos=allowed`: at most 32 new tokens, EOS allowed on both sides (the peer's model and
inputs through benchmarks/hf_generate.py, without min_new_tokens).

Cold includes compiling the programs (an advance per width class, the resizes between them);
warm reruns the same set. The search runs in flight (`decoding.scheduler`): compiled loops
of steps of every slot, new sentences put into slots as others finish; there is no per-token
Python dispatch.
"""

import dataclasses
import json
import statistics
import subprocess
import time
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import sacrebleu
from absl import app, flags

from transformer_jax.config.parse import from_config_dict
from transformer_jax.configs import default
from transformer_jax.data.eval_sets import load_eval_set
from transformer_jax.decoding import mbr
from transformer_jax.decoding.batches import decode_set, decoder
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.decoding.search import beam_search
from transformer_jax.evaluation.scoring import score
from transformer_jax.inference import trained_run
from transformer_jax.inference.translator import Translator
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import hardware, numerics
from transformer_jax.parallel.compilation import enable_compilation_cache

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A trained workdir.")
flags.DEFINE_enum("shape", "", ["", "small"], "Decode the PyTorch peer's shape instead.")
flags.DEFINE_string("torch_python", "", "Python with torch + transformers: runs the peer too.")
flags.DEFINE_integer("rounds", 2, "Alternating rounds with the peer (--shape).")
flags.DEFINE_string("split", "", "Split to decode (default: the config's test split).")
flags.DEFINE_integer("beam_size", 4, "Beam size.")
flags.DEFINE_string("dtype", "auto", "--shape: matmul dtype (auto, float32 or bfloat16).")
flags.DEFINE_string("checkpoint", "latest", "Checkpoint selection.")
flags.DEFINE_enum("eos", "forbidden", ["forbidden", "allowed"], "--shape: exactly 32 new "
                  "tokens (the peer's min_new_tokens = max_new_tokens), or at most 32 with EOS "
                  "allowed (benchmarks/hf_generate.py on the peer's side).")
flags.DEFINE_bool("interactive", False, "--workdir: time the first lines translated one by "
                  "one in a new process (run it twice: the second starts with a warm cache).")
flags.DEFINE_integer("mbr_sentences", 200, "--workdir: sentences whose 16 samples time the "
                     "MBR utilities (0: skip).")


def peer_shape():
  """Ours vs Hugging Face generate on the peer's decode benchmark (see the module doc)."""
  cfg = dataclasses.replace(from_config_dict(default.get_config()).model, vocab_size=8000,
                            d_model=256, num_heads=4, d_ff=1024, num_encoder_layers=3,
                            num_decoder_layers=3, dtype=numerics.resolve(FLAGS.dtype).dtype)
  model = Transformer(cfg)
  src = np.random.default_rng(2).integers(3, 8000, (64, 32)).astype(np.int32)
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), src[:1], src[:1, :4])["params"])
  forced = FLAGS.eos == "forbidden"

  def run():
    return beam_search(prepare(model, params), src, beam_size=4, alpha=0.6, max_len=32,
                       min_len=32 if forced else 0)

  t = time.perf_counter()
  seqs, _ = run()
  cold = time.perf_counter() - t
  lengths = (seqs[:, 0] > 0).sum(axis=1)
  assert seqs.shape == (64, 4, 32) and (not forced or (lengths == 32).all())
  ours, peer, peer_info = [], [], {}
  here = Path(__file__).resolve()
  peer_cmd = ([FLAGS.torch_python, str(here.parents[2] / "shared" / "peers" / "torch_peer.py"),
               "--config", "small", "--mode", "decode"] if forced else
              [FLAGS.torch_python, str(here.parent / "hf_generate.py")])
  for _ in range(FLAGS.rounds):
    times = []
    for _ in range(5):
      t = time.perf_counter()
      run()
      times.append(time.perf_counter() - t)
    ours.append(64 / statistics.median(times))
    if FLAGS.torch_python:
      out = subprocess.run(peer_cmd, capture_output=True, text=True, check=True)
      peer_info = json.loads(out.stdout.strip().splitlines()[-1])
      peer.append(peer_info["sentences_per_s"])
  print(f"machine: {hardware.describe_machine()}; {time.strftime('%Y-%m-%d %H:%M')}; small shape, "
        f"64 x 32 source tokens, beam 4, " + ("exactly 32 new tokens" if forced else
                                              "at most 32 new tokens, EOS allowed")
        + f", {cfg.dtype}")
  print(f"ours: {statistics.median(ours):.1f} sentences/s warm "
        f"(rounds: {', '.join(f'{x:.1f}' for x in ours)}); first call with compilation "
        f"{cold:.1f} s; outputs ended before the cap: {(lengths < 32).sum()}/64, mean length "
        f"{lengths.mean():.1f}")
  if peer:
    print(f"Hugging Face generate: {statistics.median(peer):.1f} sentences/s (rounds: "
          f"{', '.join(f'{x:.1f}' for x in peer)}); ours / HF = "
          f"{statistics.median(ours) / statistics.median(peer):.2f}x"
          + ("" if forced else f"; its outputs ended before the cap: "
             f"{peer_info['ended_before_cap']}/64, mean length {peer_info['mean_length']}"))


def _timed_decode(run, params, eval_set, cfg, rounds: int = 2):
  """(translations, seconds per round (the first compiles), the work counted in the last)."""
  timings = []
  scorer = prepare(run.model, params)
  for _ in range(rounds):
    slots = decoder(scorer, cfg, run.mesh)
    t = time.perf_counter()
    results = decode_set(scorer, eval_set, cfg, run.mesh, decoder_=slots)
    out = [[(seqs[n], float(scores[n])) for n in range(seqs.shape[0])]
           for seqs, scores in results]
    timings.append(time.perf_counter() - t)
  return out, timings, slots.counts


def _work_line(out, counts) -> str:
  lengths = sum(int((cands[0][0] > 0).sum()) for cands in out if cands)
  steps = ", ".join(f"{n} {name}" for name, n in sorted(counts.items())
                    if name.startswith("steps"))
  return (f"{counts['calls']} program calls, {steps}, {counts['resizes']} resizes; the "
          f"outputs' own lengths: {lengths:,} tokens")


def _mbr_speed(samples: list[list[str]]):
  """MBR utilities over each sentence's samples: sacreBLEU's sentence scores pair by pair (as
  before the pairwise matrices) against decoding.mbr's matrices, which equal them."""
  for utility, metric in (("chrf", sacrebleu.sentence_chrf), ("bleu", sacrebleu.sentence_bleu)):
    t = time.perf_counter()
    slow = [[sum(metric(h, [y]).score for y in c) / len(c) for h in c] for c in samples]
    t_slow = time.perf_counter() - t
    t = time.perf_counter()
    fast = [mbr.expected_utilities(c, utility) for c in samples]
    t_fast = time.perf_counter() - t
    print(f"MBR {utility} over {len(samples[0])} candidates: pairwise sacreBLEU calls "
          f"{len(samples) / t_slow:.1f} sentences/s, pairwise matrices {len(samples) / t_fast:.1f}"
          f" sentences/s ({t_slow / t_fast:.1f}x; utilities equal: {slow == fast})")


def interactive():
  """The first lines as `transformer-jax-translate --interactive` translates them: the model
  loaded, the persistent compilation cache on (run twice: the second run starts warm)."""
  enable_compilation_cache()
  t = time.perf_counter()
  translator = Translator(FLAGS.workdir, FLAGS.checkpoint)
  loaded = time.perf_counter() - t
  t = time.perf_counter()
  translator.warm_up()  # (as translate_lines does before reading the first line)
  warmed = time.perf_counter() - t
  lines = ["Ein Mann fährt mit dem Fahrrad die Straße entlang.",
           "Zwei kleine Hunde spielen im Schnee.",
           "Eine Frau in einem roten Kleid sitzt auf einer Bank und liest ein Buch."]
  times = []
  for line in lines:
    t = time.perf_counter()
    translator.translate([line])
    times.append(time.perf_counter() - t)
  print(f"machine: {hardware.describe_machine()}; model loaded in {loaded:.1f} s, warmed up in "
        f"{warmed:.1f} s; line by line: "
        + ", ".join(f"{x:.3f} s" for x in times))


def main(_):
  if FLAGS.shape:
    return peer_shape()
  if not FLAGS.workdir:
    raise app.UsageError("--workdir (a trained run) or --shape=small is required")
  if FLAGS.interactive:
    return interactive()
  run = trained_run.load(FLAGS.workdir)
  params = run.params(run.select_one(FLAGS.checkpoint, "decode_speed"))
  split = FLAGS.split or run.cfg.data.test_split
  eval_set = load_eval_set(run.cfg.data, split, run.tokenizer, dataset=run.cfg.data.test_dataset)
  print(f"machine: {hardware.describe_machine()}, {run.mesh.devices.size} device(s); "
        f"dtype {run.cfg.model.dtype}; {split}: {len(eval_set)} sentences, batch "
        f"{run.cfg.decode.batch_size}")
  searches = {f"beam {FLAGS.beam_size}": dict(beam_size=FLAGS.beam_size),
              "greedy": dict(greedy=True),
              "sampling (1 sample, as back-translation)": dict(sampling=True)}
  for name, overrides in searches.items():
    cfg = dataclasses.replace(run.cfg.decode, **overrides)
    out, timings, counts = _timed_decode(run, params, eval_set, cfg)
    hyps = [run.tokenizer.detokenize(c[0][0]) if c else "" for c in out]
    print(f"{name}: cold (with compilation) {len(out) / timings[0]:.1f} sentences/s "
          f"({timings[0]:.1f} s), warm {len(out) / timings[1]:.1f} sentences/s "
          f"({timings[1]:.1f} s); BLEU {score(hyps, eval_set.references).bleu:.2f}")
    print(f"  {_work_line(out, counts)}")
  if FLAGS.mbr_sentences:
    subset = dataclasses.replace(eval_set, sources=eval_set.sources[:FLAGS.mbr_sentences],
                                 references=eval_set.references[:FLAGS.mbr_sentences],
                                 source_ids=eval_set.source_ids[:FLAGS.mbr_sentences],
                                 target_ids=eval_set.target_ids[:FLAGS.mbr_sentences])
    cfg = dataclasses.replace(run.cfg.decode, sampling=True, mbr="chrf", mbr_candidates=16)
    out, _, _ = _timed_decode(run, params, subset, cfg, rounds=1)
    _mbr_speed([[run.tokenizer.detokenize(s) for s, _ in cands] for cands in out])


if __name__ == "__main__":
  app.run(main)
