"""A program compiled for a target, and what the compiler says of it: memory per device against
the chip's HBM, FLOPs and predicted time per step, MFU, and the collectives it runs.

How the step time is predicted, named on every report line (`method`):
  "compiler"        the TPU compiler's own estimate (`cost_analysis()["optimal_seconds"]`) of
                    the program, when it has no loop (the estimate counts a loop's body once);
  "compiler, twin"  the same estimate of the program's loop-free twin (programs.py), times the
                    twin's runs per step;
  "analytic"        the model's FLOPs at the chip's peak: a bound, where neither is sound.
Beside it, `roofline_seconds`: max(FLOPs / peak, bytes accessed / HBM bandwidth) of the same
program, the estimate any reader can redo from the printed figures."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

from transformer_jax.aot import hlo
from transformer_jax.aot.programs import Program
from transformer_jax.aot.targets import GiB, Target


@dataclasses.dataclass(frozen=True)
class Memory:
  """Bytes per device of a compiled program (XLA's memory_analysis)."""
  arguments: int
  outputs: int        # (those not aliased to a donated argument)
  temporaries: int
  code: int

  @property
  def total(self) -> int:
    return self.arguments + self.outputs + self.temporaries + self.code


@dataclasses.dataclass(frozen=True)
class Report:
  program: str
  target: str
  num_devices: int
  per: str                    # what one run is: "step", "decoding step", "batch"
  fits: bool
  memory: Memory | None       # None: the compiler refused the program (out of memory)
  hbm_bytes: int
  shortfall: str              # the compiler's words when it ran out of memory, else ""
  seconds: float              # predicted, per run
  method: str
  device_flops: float         # the compiler's count per device per run (loops applied)
  device_bytes: float
  roofline_seconds: float
  model_flops: int            # the model's FLOPs per run, all devices
  mfu: float
  tokens_per_second: float
  collectives: dict[str, hlo.Collective]
  loops: list[hlo.Loop]
  compile_seconds: float

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def _memory(compiled) -> Memory:
  m = compiled.memory_analysis()
  return Memory(m.argument_size_in_bytes, m.output_size_in_bytes - m.alias_size_in_bytes,
                m.temp_size_in_bytes, m.generated_code_size_in_bytes)


def _cost(compiled) -> tuple[float, float, float]:
  """(flops, bytes accessed, optimal seconds) per device, as the compiler estimates them."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return (float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)),
          float(cost.get("optimal_seconds", -1.0)))


def out_of_memory(error: Exception) -> str | None:
  """The compiler's one-line account of a program too big for the chip, or None."""
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
    return None
  found = re.search(r"Ran out of memory in memory space \w+\. ?(Used [^.]*\.[^.]*\.)", text)
  return found.group(1).strip() if found else text.splitlines()[0][:300]


def _keep_hlo(compiled, hlo_dir: Path | None, name: str):
  """Writes the optimised HLO where asked (`name`.hlo.txt), for reading what it does."""
  if hlo_dir is not None:
    hlo_dir.mkdir(parents=True, exist_ok=True)
    (hlo_dir / f"{name}.hlo.txt").write_text(compiled.as_text())


def compile_program(program: Program, target: Target, num_devices: int,
                    hlo_dir: Path | None = None) -> Report:
  """`program` compiled for `target` and reported (its optimised HLO, and its twin's, written
  into `hlo_dir` when given)."""
  start = time.perf_counter()
  chip = target.chip
  try:
    compiled = program.lower().compile()
  except Exception as e:  # noqa: BLE001 (only running out of memory is a finding)
    shortfall = out_of_memory(e)
    if shortfall is None:
      raise
    return Report(program.name, target.name, num_devices, program.per, False, None, chip.hbm_bytes,
                  shortfall, 0.0, "", 0.0, 0.0, 0.0, program.model_flops, 0.0, 0.0, {}, [],
                  time.perf_counter() - start)
  _keep_hlo(compiled, hlo_dir, program.name)
  memory = _memory(compiled)
  module = hlo.Module.parse(compiled.as_text())
  loops = module.loops()
  flops, bytes_, optimal = _cost(compiled)
  method = "compiler"
  if loops or optimal <= 0:
    flops, bytes_, optimal, method = _from_twin(program, flops, bytes_, hlo_dir)
  if optimal <= 0:
    optimal, method = program.model_flops / num_devices / chip.peak_bf16_flops, "analytic"
  roofline = max(flops / chip.peak_bf16_flops, bytes_ / chip.hbm_bytes_per_second)
  mfu = program.model_flops / (optimal * num_devices * chip.peak_bf16_flops)
  return Report(program.name, target.name, num_devices, program.per,
                memory.total <= chip.hbm_bytes, memory, chip.hbm_bytes, "", optimal, method,
                flops, bytes_, roofline,
                program.model_flops, mfu, program.tokens / optimal, module.collectives(),
                loops, time.perf_counter() - start)


def _from_twin(program: Program, flops: float, bytes_: float, hlo_dir: Path | None):
  """(flops, bytes, seconds, method) per run from the loop-free twin; the program's own
  figures with seconds -1 when there is none or it has loops too."""
  if program.twin is None:
    return flops, bytes_, -1.0, ""
  twin = program.twin().compile()
  _keep_hlo(twin, hlo_dir, f"{program.name}.twin")
  if hlo.Module.parse(twin.as_text()).loops():
    return flops, bytes_, -1.0, ""
  t_flops, t_bytes, t_seconds = _cost(twin)
  k = program.twin_runs
  if t_seconds <= 0:
    return flops, bytes_, -1.0, ""
  return k * t_flops, k * t_bytes, k * t_seconds, (
      "compiler, twin" + (f" x{k}" if k > 1 else ""))


def refusal(report: Report, levers: str) -> str | None:
  """The one line that says a program does not fit, what is short and what would help."""
  if report.fits:
    return None
  if report.memory is None:
    need = f"the compiler ran out of memory: {report.shortfall}"
  else:
    m = report.memory
    need = (f"needs {m.total / GiB:.2f} GiB per chip (arguments {m.arguments / GiB:.2f}, "
            f"temporaries {m.temporaries / GiB:.2f}, outputs {m.outputs / GiB:.2f}, code "
            f"{m.code / GiB:.2f}) of {report.hbm_bytes / GiB:.0f} GiB: short by "
            f"{(m.total - report.hbm_bytes) / GiB:.2f} GiB")
  return f"{report.program} does not fit {report.target}: {need}; {levers}"


def _size(n: float) -> str:
  return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"


def lines(report: Report) -> list[str]:
  """The report as a person reads it."""
  head = f"{report.program} on {report.target}"
  if report.memory is None:
    return [f"{head}: does not fit ({report.shortfall})"]
  m = report.memory
  out = [f"{head}: memory per chip {_size(m.total)} of {report.hbm_bytes / GiB:.0f} GiB "
         f"({'fits' if report.fits else 'DOES NOT FIT'}: arguments {_size(m.arguments)}, "
         f"temporaries {_size(m.temporaries)}, outputs {_size(m.outputs)}, "
         f"code {_size(m.code)})"]
  rate = (f", {report.tokens_per_second:,.0f} target tokens/s" if report.per == "step"
          else f", {report.tokens_per_second:,.0f} hypothesis tokens/s"
          if report.tokens_per_second else "")
  model_share = report.model_flops / report.num_devices / max(report.device_flops, 1)
  out.append(f"  per {report.per}: {report.seconds * 1e3:.2f} ms [{report.method}]{rate}, "
             f"MFU {report.mfu:.1%}; compiler FLOPs {report.device_flops:.3g} per chip (the "
             f"model's: {model_share:.2f}x), bytes {report.device_bytes:.3g}, roofline "
             f"{report.roofline_seconds * 1e3:.2f} ms")
  used = [f"{c.op} {c.count} ({_size(c.bytes)})" for c in report.collectives.values()
          if c.count]
  loops = ", ".join(f"{lp.trips if lp.trips is not None else '?'} trips" for lp in report.loops)
  out.append(f"  collectives per {report.per if report.per != 'decoding step' else 'loop'}: "
             f"{', '.join(used) or 'none'}; loops: {loops or 'none'}; compiled in "
             f"{report.compile_seconds:.0f} s")
  return out

