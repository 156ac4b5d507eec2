"""What an optimised HLO module (a compiled program's `as_text()`) says about how the program
runs on its devices: the collectives it performs per step (count and bytes, loop trips
applied) and its loops with their trip counts (from each loop's condition, `i < N`).

The text is read, not executed: computations are the blocks `%name (...) -> ... {` (and
`ENTRY`), instructions the lines `%name = SHAPE op(operands), attributes`. A computation runs
as often as the instructions that call it: a loop body N times per run of its loop, where N
is the constant its condition compares the counter with (None when the condition is not of
that form, e.g. a search that stops when every sentence is done)."""

from __future__ import annotations

import dataclasses
import math
import re

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
REDUCE_SCATTER_FUSION = "all-reduce-scatter"  # (the TPU compiler's name for its computations)

_HEADER = re.compile(r"^(ENTRY\s+)?%(?P<name>[\w.\-]+) .*\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(?P<root>ROOT\s+)?%(?P<name>[\w.\-]+) = (?P<shape>.*?) "
                          r"(?P<op>[a-z][a-z0-9\-]*)\((?P<rest>.*)$")
_CALLEES = re.compile(r"\b(body|condition|calls|to_apply)=%(?P<name>[\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{(?P<names>[^}]*)\}")
_ARRAY = re.compile(r"\b(pred|[suf]\d+|bf16|f8\w*|c64|c128)\[(?P<dims>[\d,]*)\]"
                    r"(?P<layout>\{[^}]*\})?")
_ON_CHIP = re.compile(r"S\([1-9]\d*\)")  # a layout's memory space other than HBM

# Where an op's bytes are counted, by the first pattern its source location (op_name) matches.
# (the fused loss's operations, its loop over tiles too, carry its name scope: ops.losses)
BLOCKS = (("attention", r"attention"), ("feed-forward", r"feed_forward|ffn_block"),
          ("output layer and loss", r"output_loss|cross_entropy"),
          ("layer norms", r"norm"), ("other model ops", r"Transformer"),
          ("outside the model (optimizer, search)", r""))
COMPILER_MOVES = "the compiler's own copies"
# (the async copies and slices the compiler adds to stage buffers in on-chip memory, and
# ConcatBitcast, which joins staged slices: the bytes they stage are counted at the
# operations that read them)
_NOT_TRAFFIC = ("parameter", "get-tuple-element", "tuple", "constant", "bitcast", "while",
                "after-all", "partition-id", "replica-id", "copy-start", "copy-done",
                "slice-start", "slice-done")
_STAGING_CALLS = ("ConcatBitcast",)

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "s4": 1,
          "u4": 1}


def shape_bytes(shape: str, hbm_only: bool = False) -> int:
  """Bytes of every array in an HLO shape (a tuple's elements summed); with `hbm_only`, of
  those in HBM (not placed in on-chip memory: `S(1)` and up in their layout)."""
  total = 0
  for m in _ARRAY.finditer(shape):
    if hbm_only and _ON_CHIP.search(m.group("layout") or ""):
      continue
    dims = [int(d) for d in m.group("dims").split(",") if d]
    total += math.prod(dims) * _BYTES.get(m.group(1), 1)  # (f8 types: one byte)
  return total


@dataclasses.dataclass(frozen=True)
class Instruction:
  name: str
  op: str
  shape: str
  rest: str
  root: bool = False


@dataclasses.dataclass(frozen=True)
class Loop:
  name: str
  trips: int | None  # None: decided at run time


@dataclasses.dataclass(frozen=True)
class Collective:
  op: str
  count: int         # per run of the program, loop trips applied
  bytes: int         # of their results, per device


@dataclasses.dataclass(frozen=True)
class Module:
  computations: dict[str, list[Instruction]]
  entry: str

  @classmethod
  def parse(cls, text: str) -> Module:
    computations, entry, current = {}, "", None
    for line in text.splitlines():
      header = _HEADER.match(line)
      if header:
        current = header.group("name")
        computations[current] = []
        if header.group(1):
          entry = current
        continue
      instruction = _INSTRUCTION.match(line) if current else None
      if instruction:
        computations[current].append(Instruction(
            instruction.group("name"), instruction.group("op"), instruction.group("shape"),
            instruction.group("rest"), bool(instruction.group("root"))))
    if not entry:
      raise ValueError("not an HLO module: no ENTRY computation")
    return cls(computations, entry)

  def trips(self, condition: str) -> int | None:
    """N of a loop whose condition is `counter < constant(N)` and nothing else, else None."""
    body = self.computations.get(condition, [])
    roots = [i for i in body if i.root and i.op == "compare" and "direction=LT" in i.rest]
    constants = {i.name: i for i in body if i.op == "constant"}
    if len(roots) != 1:
      return None
    operands = re.findall(r"%([\w.\-]+)", roots[0].rest.split(")")[0])
    values = [constants[o].rest.split(")")[0] for o in operands if o in constants]
    return int(values[0]) if len(values) == 1 and values[0].isdigit() else None

  def loop_trips(self, loop: Instruction) -> int | None:
    """A `while`'s trip count: the one the compiler recorded (the GPU compiler's
    `known_trip_count`), else read from its condition (`trips`)."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', loop.rest)
    if known:
      return int(known.group(1))
    return self.trips(re.search(r"condition=%([\w.\-]+)", loop.rest).group(1))

  def loops(self) -> list[Loop]:
    return [Loop(i.name, self.loop_trips(i))
            for body in self.computations.values() for i in body if i.op == "while"]

  def runs(self) -> dict[str, int]:
    """How many times each computation runs per run of the program (a loop of unknown trip
    count counted once)."""
    counts: dict[str, int] = {}

    def visit(name: str, times: int):
      counts[name] = counts.get(name, 0) + times
      for instruction in self.computations.get(name, []):
        if instruction.op.endswith(("-done", "-update")):  # (the start's callee, again)
          continue
        factor = 1
        if instruction.op == "while":
          factor = self.loop_trips(instruction) or 1
        for m in _CALLEES.finditer(instruction.rest):
          # (a reduction's combiner is not a program of its own; a `call`'s is: XLA:GPU
          # outlines kernel sequences into command buffers so)
          if m.group(1) != "to_apply" or instruction.op == "call":
            visit(m.group("name"), times * (factor if m.group(1) == "body" else 1))
        for m in _BRANCHES.finditer(instruction.rest):
          for branch in re.findall(r"%([\w.\-]+)", m.group("names")):
            visit(branch, times)

    visit(self.entry, 1)
    return counts

  def _collective(self, computation: str, instruction: Instruction) -> tuple[str, str] | None:
    """(kind, result shape) of a collective, None for any other instruction. An async one is
    counted at its `-done` (whose shape is the result). The TPU compiler's reduce-scatter is
    a fusion (`all-reduce-scatter`) of an all-reduce whose result the fusion's root slices: a
    reduce-scatter, its result the root's."""
    op = instruction.op.removesuffix("-done")
    if op not in COLLECTIVES or instruction.op.endswith("-start"):
      return None
    if op == "all-reduce" and computation.startswith(REDUCE_SCATTER_FUSION):
      root = next(i for i in self.computations[computation] if i.root)
      if instruction.name in _operands(root):
        return "reduce-scatter", root.shape
    return op, instruction.shape

  def _reduce_scatter_fusion(self, instruction: Instruction) -> bool:
    """Whether `instruction` calls the TPU compiler's reduce-scatter fusion."""
    callee = _CALLEES.search(instruction.rest) if instruction.op == "fusion" else None
    return bool(callee and callee.group("name").startswith(REDUCE_SCATTER_FUSION))

  def group_sizes(self) -> dict[str, list[tuple[int, int]]]:
    """Per collective kind: (devices in each of its groups, result bytes) of each that runs,
    times its runs (loop trips applied); the group size None where the text does not say."""
    found: dict[str, list] = {op: [] for op in COLLECTIVES}
    for name, times in self.runs().items():
      for instruction in self.computations.get(name, []):
        if kind := self._collective(name, instruction):
          found[kind[0]] += [(_group_size(instruction), shape_bytes(kind[1]))] * times
    return found

  def collectives(self) -> dict[str, Collective]:
    """Per collective kind: how many run per step and the bytes of their results."""
    return {op: Collective(op, len(runs), sum(size for _, size in runs))
            for op, runs in self.group_sizes().items()}

  def result_shapes(self, op: str, where: str = "") -> list[tuple[int, ...]]:
    """The dimensions of every array that the collectives `op` produce (a tuple's elements
    each), in every computation; only those whose source location (op_name) matches the
    regular expression `where`, when given."""
    found = []
    for name, body in self.computations.items():
      for instruction in body:
        kind = self._collective(name, instruction)
        if not kind or kind[0] != op:
          continue
        source = re.search(r'op_name="([^"]*)"', instruction.rest)
        if where and not (source and re.search(where, source.group(1))):
          continue
        found.extend(tuple(int(d) for d in m.group("dims").split(",") if d)
                     for m in _ARRAY.finditer(kind[1]))
    return found

  def traffic_by_block(self) -> dict[str, int]:
    """Memory traffic per run of the program by model block (BLOCKS): the bytes of each
    top-level operation's operands and result (a fusion's inner values stay on chip; where the
    compiler placed a buffer, HBM or on-chip memory, is not told apart), loop trips applied;
    collectives apart, and apart the copies the compiler added itself (operations without a
    source location, e.g. relayouts). A reading aid for where a memory-bound step spends its
    time, not the compiler's own byte count."""
    def moved(i: Instruction, shapes: dict[str, str]) -> int:
      if i.op in _NOT_TRAFFIC or i.op.endswith("-start") or (
          i.op == "custom-call" and any(f'"{c}"' in i.rest for c in _STAGING_CALLS)):
        return 0
      return self._moved(i, shapes)
    return self._by_block(moved)

  def cycles_by_block(self) -> dict[str, int]:
    """The compiler's own estimate of each operation's time, in cycles, summed by model block
    (as `traffic_by_block`): the `estimated_cycles` the TPU compiler records for each
    top-level operation, loop trips applied. The sum is not its step estimate (which also
    weighs overlap and collectives), so read as shares: where a block's time goes whether
    its bound is memory, the matrix units or the vector units (elementwise work). Empty
    where the compiler records none (XLA:CPU, XLA:GPU)."""
    def cycles(i: Instruction, shapes: dict[str, str]) -> int:
      if i.op in _NOT_TRAFFIC:  # (loops' own cycles would count their bodies twice)
        return 0
      found = re.search(r'"estimated_cycles":"(\d+)"', i.rest)
      return int(found.group(1)) if found else 0
    found = self._by_block(cycles)
    return found if any(found.values()) else {}

  def _by_block(self, measure) -> dict[str, int]:
    """measure(instruction, shapes of its computation) summed by block over the top-level
    operations, loop trips applied (collectives and the compiler's own copies apart)."""
    fused = {m.group("name") for body in self.computations.values() for i in body
             if i.op == "fusion" for m in _CALLEES.finditer(i.rest)}
    found = dict.fromkeys([name for name, _ in BLOCKS] + ["collectives", COMPILER_MOVES], 0)
    for name, times in self.runs().items():
      if name in fused:
        continue
      body = self.computations.get(name, [])
      shapes = {i.name: i.shape for i in body}
      for i in body:
        size = times * measure(i, shapes)
        if not size:
          continue
        if (i.op.removesuffix("-start").removesuffix("-done") in COLLECTIVES
            or self._reduce_scatter_fusion(i)):
          found["collectives"] += size
          continue
        where = re.search(r'op_name="([^"]*)"', i.rest)
        if where is None:
          found[COMPILER_MOVES] += size
          continue
        found[next(b for b, pattern in BLOCKS if re.search(pattern, where.group(1)))] += size
    return found

  def _moved(self, instruction: Instruction, shapes: dict[str, str]) -> int:
    """Bytes an operation reads and writes: its operands and result; for one that writes a
    slice into a buffer in place (dynamic-update-slice, also as a fusion's root), the slice
    written and the other operands; for one that reads a slice or gathers rows
    (dynamic-slice, gather), the result read and written and the other operands."""
    operand_bytes = [shape_bytes(shapes.get(o, "")) for o in _operands(instruction)]
    kind, update = instruction.op, None
    if kind == "fusion":
      callee = _CALLEES.search(instruction.rest)
      body = self.computations.get(callee.group("name"), []) if callee else []
      root = next((i for i in body if i.root), None)
      if root is not None:
        kind = root.op
        inner = {i.name: i.shape for i in body}
        names = _operands(root)
        update = inner.get(names[1], "") if len(names) > 1 else None
    elif kind == "dynamic-update-slice":
      names = _operands(instruction)
      update = shapes.get(names[1], "") if len(names) > 1 else None
    others = sum(operand_bytes) - max(operand_bytes, default=0)
    if kind == "dynamic-update-slice" and update is not None:
      return others + shape_bytes(update)
    if kind in ("dynamic-slice", "gather"):
      return others + 2 * shape_bytes(instruction.shape)
    return sum(operand_bytes) + shape_bytes(instruction.shape)


def _operands(instruction: Instruction) -> list[str]:
  return re.findall(r"%([\w.\-]+)", instruction.rest.split("), ")[0])


def _group_size(instruction: Instruction) -> int | None:
  """The devices in each group of a collective: from `replica_groups={{0,1},{2,3}}` or its
  iota form `replica_groups=[2,4]<=[8]` (2 groups of 4); None where neither is there."""
  listed = re.search(r"replica_groups=\{\{([\d,]*)\}", instruction.rest)
  if listed:
    return len(listed.group(1).split(","))
  iota = re.search(r"replica_groups=\[(\d+),(\d+)\]", instruction.rest)
  return int(iota.group(2)) if iota else None
