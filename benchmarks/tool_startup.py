"""How long a decoding tool takes from its start to its first translation, with a warm
compilation cache: `translate` of one line (piped), `translate --interactive` (its first line
answered), and `evaluate` of one batch (128 sentences of test2016, as files).

  python benchmarks/tool_startup.py --workdir=runs/default [--rounds=3] [--tools=evaluate ...]
      [--checkout=/path/to/another/clone]

Each tool runs `--rounds` times after one unmeasured run (which fills the compilation cache);
the table gives the median seconds to the first line on stdout (translate) or to the end of
the first batch (evaluate's progress), and of the whole process. With `--checkout`, the same
commands also run with that clone's package first on PYTHONPATH (the code before a change;
`--checkout=CLONE:DIR` also puts DIR's packages, e.g. an older dependency installed with
`pip install --target`, before the venv's), alternating with this one's, so that both see the
same machine.
"""

import gzip
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A trained workdir.", required=True)
flags.DEFINE_integer("rounds", 3, "Measured runs of each tool.")
TOOLS = {"translate": "translate, one line", "interactive": "translate --interactive, first line",
         "evaluate": "evaluate, first batch of 128"}
flags.DEFINE_multi_enum("tools", list(TOOLS), list(TOOLS), "Which tools to time.")
flags.DEFINE_string("checkout", "", "Another clone whose package to measure alongside (and, "
                    "':'-separated, folders of other packages to take before the venv's).")

ROOT = Path(__file__).resolve().parents[1]
LINE = "Ein Hund rennt durch den Schnee.\n"
FIRST_PROGRESS = re.compile(rb"\| *[1-9]\d*/\d+ ")  # (tqdm's count past 0: a batch is done)


def _timed(argv: list[str], stdin: str, env: dict, cwd: Path) -> tuple[float, float]:
  """(seconds to the first stdout line or progress past 0, seconds to the end). (`cwd`: not a
  checkout, whose package `python -m` would take before PYTHONPATH's.)"""
  start = time.perf_counter()
  proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, env=env, cwd=cwd)
  first = []

  def watch(stream, pattern):
    seen = b""
    while chunk := stream.read(1):
      seen = (seen + chunk)[-256:]
      if not first and pattern.search(seen):
        first.append(time.perf_counter() - start)

  watchers = [threading.Thread(target=watch, args=(proc.stdout, re.compile(rb"\n"))),
              threading.Thread(target=watch, args=(proc.stderr, FIRST_PROGRESS))]
  for watcher in watchers:
    watcher.start()
  proc.stdin.write(stdin.encode())
  proc.stdin.close()
  if proc.wait() != 0:
    raise RuntimeError(f"{' '.join(argv)} exited with {proc.returncode}")
  for watcher in watchers:
    watcher.join()
  return first[0], time.perf_counter() - start


def _batch_files(folder: Path) -> tuple[Path, Path]:
  corpus = ROOT / "transformer_jax" / "corpora" / "multi30k"
  paths = []
  for lang in ("de", "en"):
    lines = gzip.open(corpus / f"test2016.{lang}.gz", "rt", encoding="utf-8").readlines()[:128]
    paths.append(folder / f"batch.{lang}")
    paths[-1].write_text("".join(lines), encoding="utf-8")
  return tuple(paths)


def main(_):
  tmp = Path(tempfile.mkdtemp())
  workdir = Path(FLAGS.workdir).resolve()
  source, reference = _batch_files(tmp)
  python = sys.executable
  commands = {
      "translate": ([python, "-m", "transformer_jax.cli.translate",
                     f"--workdir={workdir}", "--interactive=false"], LINE),
      "interactive": (
          [python, "-m", "transformer_jax.cli.translate", f"--workdir={workdir}",
           "--interactive=true"], LINE),
      "evaluate": (
          [python, "-m", "transformer_jax.cli.evaluate", f"--workdir={workdir}",
           f"--source_file={source}", f"--reference_file={reference}",
           f"--output_dir={tmp / 'eval'}"], ""),
  }
  codes = {"this checkout": str(ROOT)}
  if FLAGS.checkout:  # (PYTHONPATH's form: the clone, and other folders after it)
    codes["--checkout"] = ":".join(str(Path(p).resolve()) for p in FLAGS.checkout.split(":"))
  print(f"{workdir}; median of {FLAGS.rounds} runs, warm compilation cache")
  for tool in FLAGS.tools:
    argv, stdin = commands[tool]
    times = {code: [] for code in codes}
    for code, path in codes.items():  # (the unmeasured run: fills the cache)
      _timed(argv, stdin, {**os.environ, "PYTHONPATH": path}, tmp)
    for _ in range(FLAGS.rounds):
      for code, path in codes.items():
        times[code].append(_timed(argv, stdin, {**os.environ, "PYTHONPATH": path}, tmp))
    for code, measured in times.items():
      first = statistics.median(t for t, _ in measured)
      whole = statistics.median(t for _, t in measured)
      print(f"  {TOOLS[tool]:<38} {code:<14} first {first:5.2f} s   whole {whole:5.2f} s")


if __name__ == "__main__":
  app.run(main)
