"""Translate text with a trained run: stdin or a file in, stdout or a file out.

  echo "Ein Hund läuft im Schnee." | python -m transformer_jax.translate --workdir=runs/default
  python -m transformer_jax.translate --workdir=runs/default --input=in.de --output=out.en \
      [--checkpoint=best] [--decode beam_size=5 --decode nbest=4]

One output line per input line, in order; an empty input line gives an empty output line.
Input is batched by length for speed, with a progress bar on long inputs; on a terminal (or
with --interactive) each line is translated as soon as it is entered. With nbest > 1 each
input gives `nbest` lines `INDEX ||| translation ||| score`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from absl import app, flags

from transformer_jax.metrics import quiet_libraries

from transformer_jax import checkpoints, corpus, data, decode, inference

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A training workdir (config.json, spm.model, checkpoints/).")
flags.DEFINE_string("checkpoint", "latest", "latest | best | STEP | average:N | steps:A,B,...")
flags.DEFINE_string("input", "-", "Input text file, one sentence per line ('-' = stdin).")
flags.DEFINE_string("output", "-", "Output file ('-' = stdout).")
flags.DEFINE_multi_string("decode", [], "Decoding override key=value (beam_size, nbest, "
                          "greedy, sampling, temperature, ...); repeatable.")
flags.DEFINE_bool("interactive", None, "Translate line by line as input arrives "
                  "(default: when stdin is a terminal).")


def decode_line(raw: bytes, name: str, number: int) -> str:
  """One input line as text; invalid UTF-8 is an error naming the input and line."""
  try:
    return raw.decode("utf-8").rstrip("\r\n")
  except UnicodeDecodeError as e:
    raise corpus.DataError(f"{name}:{number}: not valid UTF-8 ({e.reason} at byte {e.start})")


def read_input_lines(raw: bytes, name: str) -> list[str]:
  """Decodes UTF-8 input line by line."""
  lines = raw.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()  # the newline that ends the last line
  return [decode_line(line, name, number) for number, line in enumerate(lines, start=1)]


def format_output(index: int, hyps: list[tuple[str, float]], nbest: int) -> list[str]:
  if nbest == 1:
    return [hyps[0][0] if hyps else ""]
  return [f"{index} ||| {text} ||| {score:.4f}" for text, score in hyps]


class Translator:
  """A loaded model that turns lists of sentences into (n-best) translations."""

  def __init__(self, workdir: str, checkpoint: str, decode_overrides: list[str]):
    self.run = inference.load_run(workdir)
    self.decode_cfg = inference.decode_config(self.run.cfg.decode, decode_overrides)
    selected = self.run.select(checkpoint)
    if len(selected) != 1:
      raise checkpoints.CheckpointError(f"--checkpoint={checkpoint} names {len(selected)} "
                                        "models; translate uses one")
    _, steps, from_best = selected[0]
    self.params = self.run.params(steps, from_best)

  def translate(self, sentences: list[str], progress: bool = False
                ) -> list[list[tuple[str, float]]]:
    """N-best (translation, score) lists, in input order; empty sentences give []."""
    results: list[list[tuple[str, float]]] = [[] for _ in sentences]
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    if not todo:
      return results
    eval_set = data.EvalSet.from_pairs([sentences[i] for i in todo], [], self.run.tokenizer)
    longest = max(len(x) for x in eval_set.source_ids)
    if longest > self.run.cfg.model.max_len:
      print(f"translate: warning: inputs longer than {self.run.cfg.model.max_len} subwords "
            "are truncated", file=sys.stderr)
    bar = None
    if progress:
      from tqdm import tqdm
      bar = tqdm(total=len(todo), unit="sent", file=sys.stderr)
    nbest = decode.translate_nbest(self.run.model, self.params, eval_set, self.run.tokenizer,
                                   self.decode_cfg, self.run.mesh,
                                   on_batch=bar.update if bar is not None else None)
    if bar is not None:
      bar.close()
    for position, hyps in zip(todo, nbest):
      results[position] = hyps
    return results


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
  quiet_libraries()
  try:
    _run()
  except (checkpoints.CheckpointError, corpus.DataError, ValueError, FileNotFoundError) as e:
    sys.exit(f"translate: {e}")


def _run():
  interactive = FLAGS.interactive
  if interactive is None:
    interactive = FLAGS.input == "-" and sys.stdin.isatty()
  translator = Translator(FLAGS.workdir, FLAGS.checkpoint, FLAGS.decode)
  nbest = translator.decode_cfg.nbest
  out = sys.stdout if FLAGS.output == "-" else open(FLAGS.output, "w", encoding="utf-8")
  try:
    if interactive:
      for number, raw in enumerate(sys.stdin.buffer, start=1):
        line = decode_line(raw, "<stdin>", number)
        for text in format_output(number - 1, translator.translate([line])[0], nbest):
          out.write(text + "\n")
        out.flush()
      return
    name = "<stdin>" if FLAGS.input == "-" else FLAGS.input
    if FLAGS.input != "-" and not Path(FLAGS.input).is_file():
      raise corpus.DataError(f"input file {FLAGS.input} does not exist")
    raw = sys.stdin.buffer.read() if FLAGS.input == "-" else Path(FLAGS.input).read_bytes()
    lines = read_input_lines(raw, name)
    results = translator.translate(lines, progress=len(lines) >= 200)
    for index, hyps in enumerate(results):
      for text in format_output(index, hyps, nbest):
        out.write(text + "\n")
  finally:
    if out is not sys.stdout:
      out.close()


def run():
  flags.mark_flag_as_required("workdir")
  app.run(main)


if __name__ == "__main__":
  run()
