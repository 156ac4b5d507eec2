"""Data-path scaling: split, prepare, tokenize and stream one epoch of packed batches, with time
and peak memory per stage, on a corpus and on N× replicated copies of it.

  python benchmarks/data_pipeline.py --replicas=1,10      (Tatoeba de–en from ../shared/data)

For each replica count it writes a tab-separated corpus of that many copies of the pairs
(streamed), then runs each stage in a fresh process and reads that process's peak resident
memory (ru_maxrss):
  split     transformer_jax.data.splitting (by English sentence, test pairs removed)
  prepare   the array_record TFDS dataset (corpus.prepare_local)
  tokenizer an 8k SentencePiece on a sample of --tokenizer_max_sentences sentences
  epoch     one epoch of the training pipeline (shuffle, tokenize, filter, pack, batch)
The data path streams, so peak memory should not grow with the number of replicas while time
grows linearly. The epoch's packed-batch rate is compared with the training step rate of the
Tatoeba config (--train_steps_per_sec, measured in BENCHMARKS.md): tokenization keeps up when
the pipeline makes batches several times faster than the model consumes them.
"""

import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
flags.DEFINE_string("workdir", "", "Where to write (default: a temporary folder).")
flags.DEFINE_string("stage", "", "Internal: run one stage in this process.")
flags.DEFINE_string("folder", "", "Internal: the stage's folder.")


def _config(folder: Path):
  from configs import tatoeba_deen
  from transformer_jax.config.parse import from_config_dict
  c = tatoeba_deen.get_config()
  c.data.data_dir = str(folder / "split")
  c.data.cache_dir = str(folder / "tfds")
  c.data.tokenizer_max_sentences = FLAGS.tokenizer_max_sentences
  return from_config_dict(c)


def run_stage(stage: str, folder: Path) -> dict:
  """One stage, in this process; returns its figures."""
  # (imported here: each stage runs in a process of its own, whose peak memory is measured)
  from transformer_jax.data import corpus, pipeline, splitting, tokenizer
  from transformer_jax.reporting import logs
  logs.setup()
  cfg = _config(folder)
  t = time.perf_counter()
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
    tok = tokenizer.train_tokenizer(pipeline.training_sentences(cfg.data), cfg.model.vocab_size,
                                    folder / "spm.model", cfg.data.tokenizer_max_sentences)
    result = {"pieces": tok.vocab_size}
  elif stage == "epoch":
    tok = tokenizer.Tokenizer.load(folder / "spm.model")
    pipe = pipeline.train_pipeline(cfg.data, tok, seed=0)
    pairs = batches = tokens = 0
    it = iter(pipe.dataset)
    while pairs < pipe.num_examples - pipe.filter.filtered:
      batch = next(it)
      seg = batch["inputs_segment_ids"]
      # pairs in the batch: the distinct non-zero segment ids of each row
      pairs += sum(len(set(row[row > 0].tolist())) for row in seg)
      tokens += int((batch["inputs"] > 0).sum() + (batch["targets"] > 0).sum())
      batches += 1
    result = {"batches": batches, "pairs": pairs, "tokens": tokens,
              "filtered": pipe.filter.filtered}
  else:
    raise app.UsageError(f"unknown stage {stage}")
  result["seconds"] = time.perf_counter() - t
  return result


def _replicate(source: Path, out: Path, copies: int):
  """Writes `copies` copies of the pair file, streamed."""
  with gzip.open(out, "wb", compresslevel=1) as f:
    for _ in range(copies):
      with gzip.open(source, "rb") as g:
        for line in g:
          f.write(line)


def _measure(stage: str, folder: Path) -> dict:
  """Runs a stage in a child process; its figures plus the child's peak RSS."""
  proc = subprocess.Popen([sys.executable, __file__, f"--stage={stage}", f"--folder={folder}"],
                          stdout=subprocess.PIPE, text=True)
  _, status, usage = os.wait4(proc.pid, 0)
  out = proc.stdout.read()
  if os.waitstatus_to_exitcode(status) != 0:
    raise SystemExit(f"stage {stage} failed")
  result = json.loads(out.strip().splitlines()[-1])
  result["peak_rss_mib"] = usage.ru_maxrss / 1024
  return result


def main(argv):
  del argv
  if FLAGS.stage:
    print(json.dumps(run_stage(FLAGS.stage, Path(FLAGS.folder))))
    return
  root = Path(FLAGS.workdir or tempfile.mkdtemp(prefix="data_bench_"))
  print(f"machine: {hardware.describe_machine()}; {time.strftime('%Y-%m-%d %H:%M')}",
        flush=True)
  rows = []
  for copies in map(int, FLAGS.replicas):
    folder = root / f"x{copies}"
    folder.mkdir(parents=True, exist_ok=True)
    _replicate(Path(FLAGS.pairs), folder / "pairs.tsv.gz", copies)
    for stage in ("split", "prepare", "tokenizer", "epoch"):
      r = _measure(stage, folder)
      rows.append((copies, stage, r))
      extra = {k: v for k, v in r.items() if k not in ("seconds", "peak_rss_mib")}
      print(f"x{copies:<3} {stage:<9} {r['seconds']:8.1f} s  peak RSS {r['peak_rss_mib']:7.0f} "
            f"MiB  {extra}", flush=True)
      if stage == "epoch":
        rate = r["batches"] / r["seconds"]
        line = (f"      epoch: {rate:.1f} packed batches/s, {r['pairs'] / r['seconds']:,.0f} "
                f"pairs/s, {r['tokens'] / r['seconds']:,.0f} tokens/s")
        if FLAGS.train_steps_per_sec:
          line += f" = {rate / FLAGS.train_steps_per_sec:.0f}x the training step rate"
        print(line, flush=True)
  print("\n| corpus | stage | time (s) | peak RSS (MiB) |\n|---|---|---|---|")
  for copies, stage, r in rows:
    print(f"| x{copies} | {stage} | {r['seconds']:.1f} | {r['peak_rss_mib']:.0f} |")


if __name__ == "__main__":
  app.run(main)
