"""Data-path scaling: split, prepare, tokenize and stream packed batches, with time, CPU time
and peak memory per stage, on a corpus and on N× replicated copies of it.

  python benchmarks/data_pipeline.py --replicas=1,10      (Tatoeba de–en from ../shared/data)

For each replica count it writes a tab-separated corpus of that many copies of the pairs
(streamed), then runs each stage in a fresh process and reads its peak resident memory
(ru_maxrss of the process and of its largest worker process) and CPU time (user + system, its
workers included):
  split       transformer_jax.data.splitting (by English sentence, test pairs removed)
  prepare     the array_record TFDS dataset (corpus.prepare_local)
  tokenizer   an 8k SentencePiece on a sample of --tokenizer_max_sentences sentences
  tokenize    the training split as ids, once (data.tokenized: what training does on first use)
  text        the text path (config.data.pretokenize=False): shuffle, tokenize, filter, pack
              and batch, over the first --text_pairs pairs of an epoch
  ids-wN      the pre-tokenized path over one whole epoch, with N grain worker processes
              (config.data.num_workers; 0 = in the process, with its reader threads)
Pairs per CPU-second is the rate per core used. The data path streams, so peak memory should
not grow with the number of replicas while time grows linearly. The packed-batch rate is
compared with the training step rate of the Tatoeba config (--train_steps_per_sec).
"""

import dataclasses
import gzip
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from absl import app, flags

from transformer_jax.parallel import hardware

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "data"
TEST = SHARED / "tatoeba-test" / "deu-eng" / "tatoeba-test-v2021-08-07"

FLAGS = flags.FLAGS
flags.DEFINE_list("replicas", ["1", "10"], "Corpus sizes to measure, as copies of the corpus.")
flags.DEFINE_string("pairs", str(SHARED / "tatoeba-anki" / "deu-eng" / "deu.txt.gz"),
                    "Tab-separated English<TAB>German pairs.")
flags.DEFINE_integer("tokenizer_max_sentences", 300_000, "Tokenizer training sample.")
flags.DEFINE_float("train_steps_per_sec", 0.0, "Training rate to compare the epoch with.")
flags.DEFINE_integer("text_pairs", 100_000, "Pairs the text path is measured over.")
flags.DEFINE_list("workers", ["0", "1", "2"], "Worker counts of the pre-tokenized path.")
flags.DEFINE_string("workdir", "", "Where to write (default: a temporary folder).")
flags.DEFINE_string("stage", "", "Internal: run one stage in this process.")
flags.DEFINE_string("folder", "", "Internal: the stage's folder.")


def _config(folder: Path):
  from transformer_jax.config.parse import from_config_dict
  from transformer_jax.configs import tatoeba_deen
  c = tatoeba_deen.get_config()
  c.data.data_dir = str(folder / "split")
  c.data.cache_dir = str(folder / "tfds")
  c.data.tokenizer_max_sentences = FLAGS.tokenizer_max_sentences
  return from_config_dict(c)


def run_stage(stage: str, folder: Path) -> dict:
  """One stage, in this process; returns its figures."""
  # (imported here: each stage runs in a process of its own, whose peak memory is measured)
  from transformer_jax.data import corpus, pipeline, plan, splitting, tokenized, tokenizer
  from transformer_jax.reporting import logs
  logs.setup()
  cfg = _config(folder)
  t = time.perf_counter()
  cpu_start = sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (
      resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))
  if stage == "split":
    out = splitting.split_corpus(
        [folder / "pairs.tsv.gz"], ["en", "de"], folder / "split", group_by="en",
        test={"de": Path(f"{TEST}.deu.gz"), "en": Path(f"{TEST}.eng.gz")}, dedup_test_by="de")
    result = {"pairs": out["counts"]["read"], "train": out["counts"]["train"]}
  elif stage == "prepare":
    spec = corpus.corpus_spec(cfg.data)
    source = corpus.get_source(spec, "train")
    result = {"train": len(source)}
  elif stage == "tokenizer":
    sentences = pipeline.training_sentences(plan.data_plan(cfg.data))
    tok = tokenizer.train_tokenizer(sentences, cfg.model.vocab_size, folder / "spm.model",
                                    cfg.data.tokenizer_max_sentences)
    result = {"pieces": tok.vocab_size}
  elif stage == "tokenize":
    tok = tokenizer.Tokenizer.load(folder / "spm.model")
    store = tokenized.tokenized_split(corpus.corpus_spec(cfg.data), tok)
    result = {"pairs": store.num_pairs}
  elif stage == "text" or stage.startswith("ids-w"):
    tok = tokenizer.Tokenizer.load(folder / "spm.model")
    data = dataclasses.replace(cfg.data, pretokenize=stage != "text",
                               num_workers=int(stage[5:]) if stage != "text" else 0)
    pipe = pipeline.train_pipeline(plan.data_plan(data), tok, seed=0)
    pairs = batches = tokens = 0
    it = iter(pipe.dataset)
    # The text path over its first --text_pairs pairs, the pre-tokenized one over an epoch.
    while (pairs < FLAGS.text_pairs if stage == "text"
           else pipe.filter.kept + pipe.filter.filtered < pipe.num_examples):
      batch = pipe.take_stats(next(it))
      if not batches:  # (worker processes start before their first batch)
        first = time.perf_counter() - t
      pairs += int((np.diff(batch["inputs_segment_ids"], axis=1, prepend=0) > 0).sum())
      tokens += int((batch["inputs"] > 0).sum() + (batch["targets"] > 0).sum())
      batches += 1
    if hasattr(it, "close"):
      it.close()
    result = {"batches": batches, "pairs": pairs, "tokens": tokens,
              "filtered": pipe.filter.filtered, "first_batch_s": round(first, 2)}
  else:
    raise app.UsageError(f"unknown stage {stage}")
  result["seconds"] = time.perf_counter() - t
  own, workers = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                       resource.RUSAGE_CHILDREN))
  result["cpu_seconds"] = sum(u.ru_utime + u.ru_stime for u in (own, workers)) - cpu_start
  result["peak_rss_mib"] = max(own.ru_maxrss, workers.ru_maxrss) / 1024
  return result


def _replicate(source: Path, out: Path, copies: int):
  """Writes `copies` copies of the pair file, streamed."""
  with gzip.open(out, "wb", compresslevel=1) as f:
    for _ in range(copies):
      with gzip.open(source, "rb") as g:
        for line in g:
          f.write(line)


def _measure(stage: str, folder: Path) -> dict:
  """Runs a stage in a child process; its figures (the child measures its own)."""
  proc = subprocess.run([sys.executable, __file__, f"--stage={stage}", f"--folder={folder}",
                         f"--text_pairs={FLAGS.text_pairs}",
                         f"--tokenizer_max_sentences={FLAGS.tokenizer_max_sentences}"],
                        stdout=subprocess.PIPE, text=True)
  if proc.returncode != 0:
    raise SystemExit(f"stage {stage} failed")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv):
  del argv
  if FLAGS.stage:
    print(json.dumps(run_stage(FLAGS.stage, Path(FLAGS.folder))))
    return
  root = Path(FLAGS.workdir or tempfile.mkdtemp(prefix="data_bench_"))
  print(f"machine: {hardware.describe_machine()}; {time.strftime('%Y-%m-%d %H:%M')}",
        flush=True)
  stages = ["split", "prepare", "tokenizer", "tokenize", "text"] + [
      f"ids-w{n}" for n in FLAGS.workers]
  rows = []
  for copies in map(int, FLAGS.replicas):
    folder = root / f"x{copies}"
    folder.mkdir(parents=True, exist_ok=True)
    _replicate(Path(FLAGS.pairs), folder / "pairs.tsv.gz", copies)
    for stage in stages:
      r = _measure(stage, folder)
      rows.append((copies, stage, r))
      extra = {k: v for k, v in r.items() if k not in ("seconds", "peak_rss_mib", "cpu_seconds")}
      print(f"x{copies:<3} {stage:<9} {r['seconds']:8.1f} s  CPU {r['cpu_seconds']:7.1f} s  "
            f"peak RSS {r['peak_rss_mib']:6.0f} MiB  {extra}", flush=True)
      if "batches" in r:
        rate = r["batches"] / r["seconds"]
        line = (f"      {r['pairs'] / r['seconds']:,.0f} pairs/s, "
                f"{r['pairs'] / r['cpu_seconds']:,.0f} pairs per CPU-second, {rate:.1f} packed "
                f"batches/s, {r['tokens'] / r['seconds']:,.0f} tokens/s")
        if FLAGS.train_steps_per_sec:
          line += f" = {rate / FLAGS.train_steps_per_sec:.0f}x the training step rate"
        print(line, flush=True)
  print("\n| corpus | stage | time (s) | CPU (s) | pairs/s | pairs per CPU-s | peak RSS (MiB) |\n"
        "|---|---|---|---|---|---|---|")
  for copies, stage, r in rows:
    rates = (f"{r['pairs'] / r['seconds']:,.0f} | {r['pairs'] / r['cpu_seconds']:,.0f}"
             if "batches" in r else " | ")
    print(f"| x{copies} | {stage} | {r['seconds']:.1f} | {r['cpu_seconds']:.1f} | {rates} | "
          f"{r['peak_rss_mib']:.0f} |")


if __name__ == "__main__":
  app.run(main)
