"""The one way every command-line tool runs: its flags parsed, its config files loaded with their
overrides, logging set up, and a user's mistake turned into one line and an exit status.

  config mistakes (a config file, a key, a value)  ->  "config error: FILE or KEY: reason", 2
  flag mistakes                                      ->  "TOOL: reason (--help lists the flags)", 2
  bad data, checkpoints, a non-finite run            ->  "TOOL: reason", 1
  interrupted (SIGTERM in a sweep, Ctrl-C)           ->  "TOOL: reason", 130

Each run defines its flags on a fresh `absl.flags.FlagValues`, so `--help` lists exactly the
tool's own flags (also as a console script) and a tool can run in-process, e.g. from tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import re
import signal
import sys
from collections.abc import Callable

import ml_collections
from absl import flags

from transformer_jax import errors
from transformer_jax.config import files
from transformer_jax.parallel.compilation import enable_compilation_cache
from transformer_jax.reporting import logs

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130
HELP = ("-h", "-?", "--help", "--helpshort", "--helpfull")


@dataclasses.dataclass(frozen=True)
class Args:
  """A tool's parsed command line: `args.NAME` is flag NAME's value; `configs[NAME]` the
  config file of flag NAME with its overrides applied, `config_args[NAME]` those arguments as
  given (`--NAME=FILE`, then each `--NAME.KEY=VALUE`)."""
  flags: flags.FlagValues
  configs: dict[str, ml_collections.ConfigDict]
  config_args: dict[str, list[str]]

  def __getattr__(self, name: str):
    try:
      return self.flags[name].value
    except KeyError:
      raise AttributeError(name) from None


def define_decoding_flags(fv: flags.FlagValues):
  """--source_tag and --dtype, as every tool that decodes with a run takes them."""
  flags.DEFINE_string("source_tag", "", "A tag of a multilingual/tagged run put before every "
                      "source (e.g. '>>fra<<'; a mixture corpus's set keeps its own).",
                      flag_values=fv)
  flags.DEFINE_enum("dtype", "", ["", "float32", "bfloat16", "auto"], "The matmuls' dtype "
                    "(default: the run's; a run trained in bf16, this machine's choice).",
                    flag_values=fv)


def define_engine_flags(fv: flags.FlagValues):
  """--engine and --compute_type, as translate, translate-corpus and serve take them
  (interop.engines.translator makes their translator)."""
  flags.DEFINE_enum("engine", "jax", ["jax", "ctranslate2"], "Our search, or CTranslate2 (the "
                    "checkpoint exported on the fly into a cache keyed by its fingerprint, "
                    "~/.cache/transformer_jax/ctranslate2).", flag_values=fv)
  flags.DEFINE_string("compute_type", "", "ctranslate2's: float32, int8, bfloat16, ... "
                      "(default: bfloat16 where this CPU has it, else float32).", flag_values=fv)


def usage(doc: str, flag_values: flags.FlagValues) -> str:
  return (f"{doc.strip()}\n\nflags:\n"
          f"{flag_values.get_help(prefix='  ', include_special_flags=False)}")


def run(tool: str, doc: str, define_flags: Callable[[flags.FlagValues], None],
        body: Callable[[Args], object], argv: list[str] | None = None,
        configs: dict[str, str] | None = None, stop_on_sigterm: bool = False) -> int:
  """Runs `body` on the parsed `argv` (default: sys.argv); returns the exit status.
  `configs` maps each config-file flag the tool takes to its help text. `stop_on_sigterm`:
  SIGTERM raises errors.Interrupted in `body` (which may say what it saved), a line and
  status 130 instead of a silent end (the handler before is restored after)."""
  argv = list(sys.argv if argv is None else argv)
  configs = configs or {}
  flag_values = flags.FlagValues()
  for name, text in configs.items():
    flags.DEFINE_string(name, None, f"{text}; override any key with --{name}.KEY=VALUE",
                        flag_values=flag_values, required=True)
  flags.DEFINE_integer("verbosity", 0, "Library logs (Orbax, TFDS): 0 warnings, 1 info, "
                       "2 debug.", flag_values=flag_values)
  define_flags(flag_values)
  if any(arg in HELP for arg in argv[1:]):
    print(usage(doc, flag_values))
    return 0
  rest, overrides = files.split_overrides(argv, list(configs))
  try:
    extra = flag_values(rest)[1:]
    if extra:
      raise errors.UsageError(f"unexpected arguments: {' '.join(extra)}")
    for name, value in flag_values.flag_values_dict().items():  # (absl's bounds pass NaN)
      if isinstance(value, float) and not math.isfinite(value):
        raise errors.UsageError(f"--{name}={value}: not a finite number")
    loaded = {name: files.apply_overrides(files.load_file(flag_values[name].value),
                                          overrides[name], name) for name in configs}
    given = {name: [f"--{name}={flag_values[name].value}", *overrides[name]]
             for name in configs}
    logs.setup(flag_values.verbosity)
    enable_compilation_cache()
    with _interrupted_by_sigterm() if stop_on_sigterm else contextlib.nullcontext():
      body(Args(flag_values, loaded, given))
    return 0
  except errors.ConfigError as e:
    return _fail(f"config error: {e}", EXIT_USAGE)
  except (flags.Error, errors.UsageError) as e:
    return _fail(f"{tool}: {_flag_message(e)} (--help lists the flags)", EXIT_USAGE)
  except errors.Interrupted as e:
    return _fail(f"{tool}: {e}", EXIT_INTERRUPTED)
  except errors.Error as e:
    return _fail(f"{tool}: {e}", EXIT_ERROR)
  except Exception as e:  # noqa: BLE001 (only a file's OS error becomes one line)
    cause = errors.filesystem_cause(e)
    if cause is None:
      other = errors.os_error_of(e)  # (unmarked: whether it was read or written is not known)
      if other is None:
        raise
      return _fail(f"{tool}: {other.filename}: {other.strerror} ({errors.KEPT})", EXIT_ERROR)
    # (Orbax's background writers that failed alike are reported again by asyncio at exit)
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    return _fail(f"{tool}: cannot write {cause.filename or 'a file'}: {cause.strerror} "
                 f"({getattr(cause, 'kept', errors.KEPT)})", EXIT_ERROR)
  except KeyboardInterrupt:
    return _fail(f"{tool}: interrupted", EXIT_INTERRUPTED)


@contextlib.contextmanager
def _interrupted_by_sigterm():
  def stop(signum, frame):
    raise errors.Interrupted("stopped by SIGTERM")

  previous = signal.signal(signal.SIGTERM, stop)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, previous)


def _flag_message(error: Exception) -> str:
  """absl's message in one line, a missing required flag said plainly."""
  text = "; ".join(filter(None, (line.strip() for line in str(error).splitlines())))
  return re.sub(r"flag --(\w+)=None: Flag --\1 must have a value other than None\.",
                r"--\1 is required", text)


def _fail(message: str, status: int) -> int:
  print(" ".join(message.splitlines()), file=sys.stderr, flush=True)
  return status


def main(*args, **kwargs):
  """`run`, then exit with its status (what console scripts and `python -m` call)."""
  sys.exit(run(*args, **kwargs))
