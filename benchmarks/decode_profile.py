"""Where a beam step's time goes: a profile of the compiled search loop (the slots' advance,
all of a batch's sentences put into slots at once), by part of the model.

  python benchmarks/decode_profile.py --workdir=runs/default [--sentences=128] [--beam_size=4] \
      [--beam_impl=gather]

Beam-searches one batch of the split (`--batch`, of `--sentences` sentences, batched as
`evaluate` does: length-sorted) three times: the first
compiles (XLA's optimised HLO of the search loop is dumped to a temporary folder, so the
persistent compilation cache is not used), the second runs warm, the third runs under
`jax.profiler` (a Perfetto trace). The advance's run (its steps with every slot stepping,
finished ones included) is then split by XLA operation, each mapped through the HLO's
`op_name` to a part: the dense projections, the output layer with its log-softmax, the
attention products, the beam's cache reorder, top-k, ... The table gives each part's
milliseconds per step (the operations' own times; on several cores two operations may run
at once, so the parts can add up to more than a step's wall time). Before it, the loop body's
HLO instructions: XLA:CPU runs one thunk per instruction, each costing a few nanoseconds per
step whatever its size (jax #40150), so their number is a cost of its own.
"""

import collections
import dataclasses
import gzip
import itertools
import json
import os
import re
import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from absl import app, flags

from transformer_jax.data.eval_sets import load_eval_set
from transformer_jax.decoding import slots
from transformer_jax.decoding.batches import sentence_caps
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.decoding.search import beam_search
from transformer_jax.inference import trained_run
from transformer_jax.parallel import hardware

FLAGS = flags.FLAGS
flags.DEFINE_string("workdir", None, "A trained workdir.", required=True)
flags.DEFINE_string("split", "", "Split whose first sentences are decoded (default: the "
                    "config's test split).")
flags.DEFINE_integer("sentences", 128, "Sentences in the batch.")
flags.DEFINE_integer("batch", 0, "Which batch of the length-sorted split (0: the shortest "
                     "sources).")
flags.DEFINE_integer("beam_size", 4, "Beam size.")
flags.DEFINE_enum("beam_impl", "flat", ["gather", "flat"], "How hypotheses keep their "
                  "caches (config.decode.beam_impl; flat: what auto runs).")
flags.DEFINE_string("checkpoint", "latest", "Checkpoint selection.")

LOOP = f"jit_{slots.beam_advance.__name__}"  # (its HLO module, the program store off)
PARTS = (  # (part, a pattern of the operation's op_name), the first that matches
    ("output layer + log-softmax", r"log_softmax"),
    ("beam reorder (cache gather)", r"take_along_axis"),
    ("cross-attention products", r"cross_attention/b\w+,b\w+->"),
    ("self-attention products", r"self_attention/b\w+,b\w+->"),
    ("dense projections (Q, K, V, O, FFN)", r"/(query|key|value|output|wi|wo)/\.\.\."),
    ("attention softmax", r"softmax"),
    ("top-k", r"top_k"),
    ("layer norm", r"norm"),
)


def _instructions(hlo: str) -> dict[str, str]:
  """XLA operation -> its HLO line."""
  return dict(re.findall(r"^\s*(?:ROOT )?%(\S+) = (.*)$", hlo, re.M))


def _first_hlo(dump: Path) -> Path:
  """The optimised HLO of the first search loop compiled (the batch's full size)."""
  return sorted(dump.glob(f"module_*.{LOOP}.cpu_after_optimizations.txt"))[0]


# (instructions that run no code of their own: XLA:CPU makes no thunk for them)
_FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast"}


def _computations(hlo: str) -> dict[str, list[str]]:
  """Computation name -> its instructions' opcodes, from HLO text."""
  out, current = {}, None
  for line in hlo.splitlines():
    header = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
    if header:
      current = out.setdefault(header.group(1), [])
    elif line.startswith("}"):
      current = None
    elif current is not None:
      opcode = re.search(r" = .*?\s([a-z][a-z0-9-]*)\(", line)
      if opcode:
        current.append(opcode.group(1))
  return out


def loop_body_instructions(hlo: str) -> collections.Counter:
  """The opcodes of the search loop's body, counted: what each step runs (the body of the
  largest while loop of the program; XLA:CPU puts the loop in a computation it calls)."""
  computations = _computations(hlo)
  bodies = re.findall(r" while\(.*?body=%([\w.-]+)", hlo)
  return collections.Counter(max((computations[b] for b in bodies), key=len))


def _part(op: str, instruction: str) -> str:
  if op.startswith("copy"):
    return "copies (the loop's carry)"
  op_name = re.search(r'op_name="([^"]*)"', instruction)
  if op_name is None and re.search(r"\bdot\(.*lhs_batch_dims", instruction):
    return "self-attention products"  # (XLA's rewrite of the cache's einsums drops op_name)
  for part, pattern in PARTS:
    if op_name and re.search(pattern, op_name.group(1)):
      return part
  return "other (elementwise, bookkeeping)"


def _first_loop_run(trace_dir: Path) -> list[dict]:
  """The trace's events of the search loop's first run (its full-size program)."""
  trace = next(trace_dir.rglob("perfetto_trace.json.gz"))
  events = [e for e in json.load(gzip.open(trace))["traceEvents"]
            if e.get("ph") == "X" and e.get("args", {}).get("hlo_module") == LOOP]
  first = min(events, key=lambda e: e["ts"])["args"]["run_id"]
  return [e for e in events if e["args"]["run_id"] == first]


def main(_):
  work = Path(tempfile.mkdtemp(prefix="decode_profile_"))
  # (before anything runs: the backend reads XLA_FLAGS when it starts, at the first use)
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_dump_to={work / 'hlo'} --xla_dump_hlo_module_re={LOOP}")
  run = trained_run.load(FLAGS.workdir)
  params = run.params(run.select_one(FLAGS.checkpoint, "decode_profile"))
  split = FLAGS.split or run.cfg.data.test_split
  eval_set = load_eval_set(run.cfg.data, split, run.tokenizer, dataset=run.cfg.data.test_dataset)
  batches = eval_set.batches(FLAGS.sentences, max_len=run.cfg.model.max_len)
  rows, batch = next(itertools.islice(batches, FLAGS.batch, None))
  inputs = np.asarray(batch["inputs"][:len(rows)])
  cfg = dataclasses.replace(run.cfg.decode, beam_size=FLAGS.beam_size)
  caps = sentence_caps(cfg, inputs, None, run.cfg.model.max_len)

  def decode():
    start = time.perf_counter()
    beam_search(prepare(run.model, params), inputs, beam_size=cfg.beam_size,
                alpha=cfg.length_penalty, max_len=int(caps.max()), caps=caps,
                beam_impl=FLAGS.beam_impl)
    return time.perf_counter() - start

  cold, warm = decode(), decode()
  jax.profiler.start_trace(str(work / "trace"), create_perfetto_trace=True)
  traced = decode()
  jax.profiler.stop_trace()

  hlo = _first_hlo(work / "hlo").read_text()
  instructions, body = _instructions(hlo), loop_body_instructions(hlo)
  running = sum(n for op, n in body.items() if op not in _FREE)
  events = _first_loop_run(work / "trace")
  # (most operations of the loop's body run once a step: the commonest count is the steps)
  runs_per_op = collections.Counter(e["args"]["hlo_op"] for e in events)
  steps = collections.Counter(runs_per_op.values()).most_common(1)[0][0]
  loop_ops = [e for e in events if not e["args"]["hlo_op"].startswith("while")]
  span = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
  per_part = collections.Counter()
  for e in loop_ops:
    op = e["args"]["hlo_op"]
    per_part[_part(op, instructions.get(op, ""))] += e["dur"]
  total = sum(per_part.values())
  print(f"machine: {hardware.describe_machine()}; dtype {run.cfg.model.dtype}; {split}: "
        f"batch {FLAGS.batch}, {len(rows)} sentences (sources of {inputs.shape[1]} positions), "
        f"beam {cfg.beam_size} ({FLAGS.beam_impl}): cold {cold:.1f} s, warm {warm:.2f} s, "
        f"traced {traced:.2f} s")
  print(f"the loop's full-size run ({len(rows)} x {cfg.beam_size} rows): {steps} steps, "
        f"{span / steps / 1e3:.1f} ms a step (wall), {total / steps / 1e3:.1f} ms of operations")
  print(f"the loop body: {sum(body.values())} HLO instructions, {running} that run code "
        f"(commonest: {', '.join(f'{op} {n}' for op, n in body.most_common(8))})")
  print("| part | ms per step | share |\n|---|---|---|")
  for part, micros in per_part.most_common():
    print(f"| {part} | {micros / steps / 1e3:.1f} | {100 * micros / total:.0f}% |")
  print(f"(trace and HLO in {work})")


if __name__ == "__main__":
  app.run(main)
