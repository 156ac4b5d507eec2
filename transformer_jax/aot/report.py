"""A program compiled for a target, and what the compiler says of it: memory per device against
the chip's HBM, FLOPs and predicted time per step, MFU, and the collectives it runs.

How the step time is predicted, named on every report line (`method`):
  "compiler"   the TPU compiler's own estimate of the program (`cost_analysis()`'s
               "optimal_seconds"), where it gives one (> 0; for train steps on v4, v5e and
               v6e it does not);
  "roofline"   otherwise max(FLOPs / peak, bytes accessed / HBM bandwidth) of the compiler's
               counts: what a memory- or compute-bound program cannot beat;
  ", loop-free twin xK"  of the program's twin (programs.py), K runs of it: the compiler counts
               a loop's body once, so a program with loops is estimated from the twin, and
  "+ loop traffic"  the HBM bytes its loops move beyond the twin's (a tiled loss's
               accumulator, read and written per tile; hlo.traffic_by_block) at HBM bandwidth.
A program with loops and no twin is estimated as it is, its loops counted once (a lower bound,
said on the line).
  "GPU roofline"  on GPUs, whose compiler counts nothing (`cost_analysis()` is None): max of
               the model's FLOPs per GPU (flops.py) over the peak, the HBM traffic of the
               optimised HLO (hlo.traffic_by_block, loop trips applied) over HBM bandwidth,
               and the collectives' bytes over NVLink (a ring's 2(n-1)/n of an all-reduce,
               (n-1)/n of a gather), divided by GPU_ROOFLINE_SHARE: the share of the roofline
               a measured step reaches (calibrated on the H200, BENCHMARKS.md).
MFU is the model's FLOPs (flops.py) over predicted time times peak."""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

from transformer_jax import atomic
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
  traffic: dict[str, int]     # HBM bytes per run by model block (hlo.traffic_by_block)
  cycles: dict[str, int]      # the compiler's estimated cycles by block (hlo.cycles_by_block)
  loop_traffic: float         # bytes the loops move beyond the twin's (in `seconds`)
  compile_seconds: float

  def to_json(self) -> dict:
    return dataclasses.asdict(self)


def _memory(compiled) -> Memory:
  m = compiled.memory_analysis()
  return Memory(m.argument_size_in_bytes, m.output_size_in_bytes - m.alias_size_in_bytes,
                m.temp_size_in_bytes, m.generated_code_size_in_bytes)


def compiler_cost(compiled) -> tuple[float, float, float]:
  """(flops, bytes accessed, optimal seconds) per device, as the compiler estimates them
  (zeros and -1 where it gives none: the CUDA compiler)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  if not cost:
    return 0.0, 0.0, -1.0
  return (float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)),
          float(cost.get("optimal_seconds", -1.0)))


def out_of_memory(error: Exception) -> str | None:
  """The compiler's account of a program too big for the chip, in one line, or None."""
  text = str(error)
  if "RESOURCE_EXHAUSTED" not in text and "Ran out of memory" not in text:
    return None
  found = re.search(r"Used (\S+) of (\S+) hbm\. Exceeded hbm capacity by (\S+?)\.(?:\s|$)",
                    text)
  if found:
    return f"used {found[1]} of {found[2]} HBM, {found[3]} over"
  return " ".join(text.split())[:300]


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
    return Report(program.name, target.name, num_devices, program.per, False, None,
                  chip.hbm_bytes, shortfall, 0.0, "", 0.0, 0.0, 0.0, program.model_flops, 0.0,
                  0.0, {}, [], {}, {}, 0.0, time.perf_counter() - start)
  _keep_hlo(compiled, hlo_dir, program.name)
  memory = _memory(compiled)
  module = hlo.Module.parse(compiled.as_text())
  estimate = (gpu_estimate(module, program.model_flops, chip, num_devices)
              if chip.gpu is not None else _estimate(program, compiled, module, chip, hlo_dir))
  seconds = estimate.seconds
  mfu = program.model_flops / (seconds * num_devices * chip.peak_bf16_flops)
  return Report(program.name, target.name, num_devices, program.per,
                memory.total <= chip.hbm_bytes, memory, chip.hbm_bytes, "", seconds,
                estimate.method, estimate.flops, estimate.bytes, estimate.roofline,
                program.model_flops, mfu, program.tokens / seconds, module.collectives(),
                module.loops(), module.traffic_by_block(), module.cycles_by_block(),
                estimate.loop_traffic,
                time.perf_counter() - start)


@dataclasses.dataclass(frozen=True)
class Estimate:
  seconds: float
  method: str
  flops: float          # per device per run
  bytes: float
  roofline: float       # max(flops / peak, bytes / HBM bandwidth)
  loop_traffic: float   # HBM bytes the program's loops move beyond its twin's (traffic count)


def _estimate(program: Program, compiled, module: hlo.Module, chip, hlo_dir) -> Estimate:
  """The step time (see the module docstring): from the program where it has no loop, else
  from its loop-free twin plus the extra traffic of its loops at HBM bandwidth; the
  compiler's estimate where it gives one (> 0), else the roofline of the compiler's counts."""
  source, runs, extra, how = compiled, 1, 0.0, ""
  twin = _twin(program, hlo_dir) if module.loops() else None
  if twin is not None:
    twin_module = hlo.Module.parse(twin.as_text())
    if not twin_module.loops():
      source, runs = twin, program.twin_runs
      extra = max(0.0, sum(module.traffic_by_block().values())
                  - runs * sum(twin_module.traffic_by_block().values()))
      # (a step's twin is a whole step at 1/k of the batch: its update counted k times)
      how = ", loop-free twin" + (f" x{runs}, the update counted {runs} times: an upper "
                                  "bound" if runs > 1 else "")
  flops, bytes_, optimal = (runs * x for x in compiler_cost(source))
  roofline = max(flops / chip.peak_bf16_flops, bytes_ / chip.hbm_bytes_per_second)
  if source is compiled and module.loops():
    how = ", loops counted once: a lower bound"
  if optimal > 0:
    seconds, method = optimal, "compiler" + how
  else:
    seconds, method = roofline, "roofline" + how
  if extra:
    seconds += extra / chip.hbm_bytes_per_second
    method += " + loop traffic"
  return Estimate(seconds, method, flops, bytes_, roofline, extra)


# The share of the GPU roofline a measured step reached: wmt_base's train step on the H200
# lent to gpu_check.py with the attention compiled here (XLA's), against this roofline of
# its program compiled for h200-1 (BENCHMARKS.md, "GPU targets: the H200 calibration").
GPU_ROOFLINE_SHARE = 0.62


def gpu_estimate(module: hlo.Module, model_flops: float, chip, num_devices: int) -> Estimate:
  """The step time on GPUs (see the module docstring) of a program whose optimised HLO is
  `module` and whose model FLOPs, all devices together, are `model_flops`."""
  flops = model_flops / num_devices
  traffic = module.traffic_by_block()
  bytes_ = sum(size for block, size in traffic.items() if block != "collectives")
  roofline = max(flops / chip.peak_bf16_flops, bytes_ / chip.hbm_bytes_per_second,
                 link_seconds(module.group_sizes(), num_devices, chip.gpu.link_bytes_per_second))
  return Estimate(roofline / GPU_ROOFLINE_SHARE, "GPU roofline", flops, bytes_, roofline, 0.0)


def link_seconds(groups: dict[str, list[tuple[int | None, int]]], num_devices: int,
                 link_bytes_per_second: float) -> float:
  """The time the collectives (`hlo.Module.group_sizes`: each one's group size, None for the
  whole mesh, and result bytes) take on links of that bandwidth, as rings of n devices: an
  all-reduce sends 2(n-1)/n of its array, an all-gather (n-1)/n of its result, a
  reduce-scatter n-1 times its result, an all-to-all (n-1)/n."""
  sent = {"all-reduce": lambda n: 2 * (n - 1) / n, "all-gather": lambda n: (n - 1) / n,
          "reduce-scatter": lambda n: n - 1, "all-to-all": lambda n: (n - 1) / n,
          "collective-permute": lambda n: 1.0 if n > 1 else 0.0}
  return sum(sent[op](n or num_devices) * size for op, found in groups.items()
             for n, size in found) / link_bytes_per_second


def _twin(program: Program, hlo_dir):
  """The program's loop-free twin compiled, or None (none, or too big for the chip: the
  one-tile loss of a twin can be where the tiled program fits)."""
  if program.twin is None:
    return None
  try:
    twin = program.twin().compile()
  except Exception as e:  # noqa: BLE001 (only running out of memory is expected)
    if out_of_memory(e) is None:
      raise
    return None
  _keep_hlo(twin, hlo_dir, f"{program.name}.twin")
  return twin


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


def write_json(path: str, target: Target, command: list[str], reports: list[Report]):
  """Every figure of `reports`, with the command that made them."""
  atomic.write_json(path, {"target": target.name, "slices": target.num_slices,
                           "command": " ".join(command),
                           "reports": [r.to_json() for r in reports]}, indent=1)


def _size(n: float) -> str:
  return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / 2**20:.1f} MiB"


def _shares(by_block: dict[str, float]) -> str:
  """Each block's share of the total, largest first, those under half a percent left out."""
  total = sum(by_block.values()) or 1
  return ", ".join(f"{name} {n / total:.0%}" for name, n in
                   sorted(by_block.items(), key=lambda kv: -kv[1]) if n / total >= 0.005)


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
  counts = (f"compiler FLOPs {report.device_flops:.3g} per chip (the model's: "
            f"{model_share:.2f}x), bytes {report.device_bytes:.3g}, roofline "
            f"{report.roofline_seconds * 1e3:.2f} ms")
  if report.method == "GPU roofline":  # (the CUDA compiler counts nothing)
    counts = (f"the model's FLOPs {report.device_flops:.3g} per GPU, the HLO's HBM traffic "
              f"{report.device_bytes:.3g} bytes, roofline {report.roofline_seconds * 1e3:.2f} "
              f"ms (a measured step reached {GPU_ROOFLINE_SHARE:.0%} of its roofline)")
  out.append(f"  per {report.per}: {report.seconds * 1e3:.2f} ms [{report.method}]{rate}, "
             f"MFU {report.mfu:.1%}; {counts}")
  out.append(f"  HBM traffic per {report.per}: {_shares(report.traffic)} of "
             f"{_size(sum(report.traffic.values()) or 1)}"
             + (f" (loops beyond the twin: {_size(report.loop_traffic)})"
                if report.loop_traffic else ""))
  cycles = sum(report.cycles.values())
  if cycles:  # (where each block's time goes, by the compiler's own estimate)
    out.append(f"  the compiler's time per {report.per}: {_shares(report.cycles)} of "
               f"{cycles:.3g} cycles")
  used = [f"{c.op} {c.count} ({_size(c.bytes)})" for c in report.collectives.values()
          if c.count]
  loops = ", ".join(f"{lp.trips if lp.trips is not None else '?'} trips" for lp in report.loops)
  out.append(f"  collectives per {report.per if report.per != 'decoding step' else 'loop'}: "
             f"{', '.join(used) or 'none'}; loops: {loops or 'none'}; compiled in "
             f"{report.compile_seconds:.0f} s")
  return out

