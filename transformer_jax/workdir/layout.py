"""What a run folder (the workdir) holds, by name, and the small files in it:

  config.json           the resolved config (written once the run's checkpoints accept it)
  spm.model             the joint SentencePiece model (unless config.data.tokenizer_path)
  tokenizer.json        path and fingerprint of the tokenizer the run was trained with
  checkpoints/          Orbax checkpoints: train state + data-iterator position (checkpoints.py)
  checkpoints_best/     the best checkpoint by validation BLEU
  checkpoints_damaged/  checkpoints that failed to restore, set aside
  averaged.json         in a workdir `average` wrote: the run and steps its checkpoint is a mean of
  metrics.jsonl, tensorboard/, metrics.png   the run's metrics and curves (reporting/)
  eval/<set>/           translations (<label>.hyp) and results.json of each evaluated set:
                        the test split at the end of training, and every `evaluate` run

Only process 0 writes these files; every process may read them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path

import jax
import ml_collections

from transformer_jax import atomic
from transformer_jax.config.fields import added_keys
from transformer_jax.config.parse import from_config_dict
from transformer_jax.config.sections import SECTIONS, DecodeConfig, TrainConfig
from transformer_jax.errors import (
  CheckpointError,
  ConfigError,
  FilesystemError,
  TokenizerDamaged,
)

CONFIG = "config.json"
TOKENIZER = "spm.model"
TOKENIZER_RECORD = "tokenizer.json"
CHECKPOINTS = "checkpoints"
BEST_CHECKPOINTS = "checkpoints_best"
RESULTS = "results.json"
MEMBERS = "members"  # a population's: members/<i>/, each member's workdir
VALIDATION = "validation"  # the main validation set's translations: last.*, best.*, references
STOP_REQUEST = "stop_request"  # in a member's workdir: the member is to stop (a sweep pruned it)
AVERAGED = "averaged.json"
PLAN = "plan.json"  # a planned run's measured speed and chosen steps (training.planning)


def check_writable(folder: str | Path):
  """Raises FilesystemError naming `folder` unless a file can be written there (read-only or
  full filesystems, missing permissions), before long work whose results would be lost. The
  folders it makes for the check are removed again: work that fails leaves none behind."""
  folder = Path(folder)
  made = [p for p in (folder, *folder.parents) if not p.exists()]  # (deepest first)
  probe = folder / f".write-check-{os.getpid()}"
  try:
    folder.mkdir(parents=True, exist_ok=True)
    with open(probe, "wb") as f:
      f.write(b"\0" * 65536)
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:
    raise FilesystemError(f"cannot write {folder}: {e.strerror}") from None
  finally:
    with contextlib.suppress(OSError):
      probe.unlink()
    for path in made:
      with contextlib.suppress(OSError):
        path.rmdir()


def tokenizer_path(cfg: TrainConfig, workdir: str | Path) -> Path:
  """The run's tokenizer: config.data.tokenizer_path, or <workdir>/spm.model."""
  return Path(cfg.data.tokenizer_path) if cfg.data.tokenizer_path else Path(workdir) / TOKENIZER


def eval_dir(workdir: str | Path, name: str) -> Path:
  """Where the translations and results of evaluation set `name` go."""
  return Path(workdir) / "eval" / name


def member_dir(workdir: str | Path, i: int) -> Path:
  return Path(workdir) / MEMBERS / str(i)


def members(workdir: str | Path) -> list[Path]:
  """A population's member workdirs, in order; [] for a run that is not one."""
  folder = Path(workdir) / MEMBERS
  return sorted((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)) \
      if folder.is_dir() else []


def request_stop(member_workdir: str | Path, reason: str):
  """Asks a running population to stop this member (at its next validation, or when it
  is resumed); the member's trained state so far is kept."""
  Path(member_workdir).mkdir(parents=True, exist_ok=True)
  Path(member_workdir, STOP_REQUEST).write_text(reason + "\n")


def stop_request(member_workdir: str | Path) -> str | None:
  """Why the member is to stop, or None."""
  path = Path(member_workdir, STOP_REQUEST)
  return path.read_text().strip() or "stop requested" if path.is_file() else None


def record_average(workdir: str | Path, source: str | Path, steps: list[int]):
  """Records in a workdir `average` wrote that its checkpoint is the mean of `steps` of the
  run in `source` (what its label then says)."""
  if jax.process_index() == 0:
    atomic.write_json(Path(workdir) / AVERAGED, {"workdir": str(Path(source).absolute()),
                                                 "steps": list(steps)}, indent=2)


def averaged_steps(workdir: str | Path) -> list[int] | None:
  """The steps the checkpoint of a workdir `average` wrote is the mean of; None for a run."""
  path = Path(workdir) / AVERAGED
  return [int(s) for s in read_json(path)["steps"]] if path.is_file() else None


def has_checkpoints(workdir: str | Path) -> bool:
  """Whether the run has saved a checkpoint (a step's folder), without opening them."""
  folder = Path(workdir) / CHECKPOINTS
  return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


def save_config(config_dict: dict, workdir: str | Path):
  if jax.process_index() == 0:
    atomic.write_json(Path(workdir) / CONFIG, config_dict, indent=2, sort_keys=True)


# Config keys added after workdirs were first written, with the value that means what a run
# from before them did (each declared beside its field): an older config.json still loads.
ADDED_KEYS = added_keys({"": TrainConfig, **SECTIONS})


def config_file(workdir: str | Path) -> Path:
  """The run's config.json; a CheckpointError when there is none (not a workdir: a typo)."""
  path = Path(workdir) / CONFIG
  if not path.is_file():
    raise CheckpointError(
        f"{workdir} has no {CONFIG}: not a transformer_jax workdir (training writes it)")
  return path


def read_json(path: str | Path):
  """A JSON file of a run; one that is not JSON (truncated, garbled, not UTF-8) is a
  CheckpointError naming it."""
  try:
    return json.loads(Path(path).read_bytes().decode("utf-8"))
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{path} is damaged: not JSON ({e.msg}: line {e.lineno} column "
                          f"{e.colno}); it is left as it is") from None
  except UnicodeDecodeError as e:
    raise CheckpointError(f"{path} is damaged: not UTF-8 (byte {e.start}); it is left as "
                          "it is") from None


def read_config(workdir: str | Path) -> dict:
  """The config a run was trained with, as saved in its config.json (keys added since it was
  written filled in from ADDED_KEYS)."""
  path = config_file(workdir)
  config = read_json(path)
  if not isinstance(config, dict):
    raise CheckpointError(f"{path} is damaged: not a JSON object; it is left as it is")
  return _with_added_keys(config)


def _with_added_keys(config: dict) -> dict:
  """`config` (a config.json's dict, or its sections wanted) with the keys added since it was
  written, at their values for older runs (ADDED_KEYS), set in place."""
  for (*sections, key), value in ADDED_KEYS.items():
    node = config
    for name in sections:
      node = node.setdefault(name, {})
    node.setdefault(key, value)
  return config


def load_config(workdir: str | Path) -> TrainConfig:
  """The config a run was trained with (`read_config`), checked as any config is; an error
  in it names the file. A population's workdir is an error naming its members' (the tools
  take those)."""
  try:
    cfg = from_config_dict(ml_collections.ConfigDict(read_config(workdir)))
  except ConfigError as e:
    raise ConfigError(f"{Path(workdir) / CONFIG}: {e}") from None
  if cfg.population.size:  # (its checkpoints hold every member at once)
    raise CheckpointError(
        f"{workdir} is a population of {cfg.population.size} members: give one member's "
        f"workdir, {Path(workdir) / MEMBERS}/<i> (0 to {cfg.population.size - 1})")
  return cfg


def record_tokenizer(workdir: str | Path, tokenizer):
  """Writes tokenizer.json (path and fingerprint of `tokenizer`) unless the run has one already."""
  record = Path(workdir) / TOKENIZER_RECORD
  if not record.is_file() and jax.process_index() == 0:
    atomic.write_json(record, {"path": str(tokenizer.path), "fingerprint": tokenizer.fingerprint,
                               "vocab_size": tokenizer.vocab_size})


@contextlib.contextmanager
def naming_recorded_fingerprint(workdir: str | Path):
  """A damaged tokenizer's error, raised in the block, with the fingerprint that the run's
  tokenizer.json records (what a restored file must have)."""
  try:
    yield
  except TokenizerDamaged as e:
    record = Path(workdir) / TOKENIZER_RECORD
    try:
      fingerprint = json.loads(record.read_text())["fingerprint"]
    except (OSError, ValueError, KeyError):
      raise e from None
    raise TokenizerDamaged(f"{e}; {record} records its fingerprint: {fingerprint}") from None


def tokenizer_mismatch(workdir: str | Path, tokenizer) -> str | None:
  """What is wrong when `tokenizer` is not the tokenizer the run in `workdir` was trained with (as
  recorded in its tokenizer.json); None when it is, or when nothing is recorded."""
  record = Path(workdir) / TOKENIZER_RECORD
  if not record.is_file():
    return None
  recorded = read_json(record)
  if recorded["fingerprint"] == tokenizer.fingerprint:
    return None
  return (f"tokenizer {tokenizer.path} is not the one {workdir} was trained with "
          f"({recorded['path']}, fingerprint {recorded['fingerprint']}, recorded in {record}; "
          f"this file's is {tokenizer.fingerprint})")


def write_lines(path: Path, lines: list[str]):
  """One line per entry, UTF-8 (translations, in input order)."""
  if jax.process_index() == 0:
    atomic.write_text(path, "".join(line + "\n" for line in lines))


def read_lines(path: Path) -> list[str]:
  """A file's lines, the last one with or without its newline (as sacreBLEU reads them)."""
  lines = Path(path).read_text(encoding="utf-8").split("\n")
  return lines[:-1] if lines[-1] == "" else lines


def save_validation(workdir: str | Path, step: int, hyps: list[str], references: list[str],
                    score):
  """The main validation set's translations at `step` (`validation/last.hyp`, its scores in
  `last.json`) and, once, its references: what a sweep's report tests trials on."""
  folder = Path(workdir) / VALIDATION
  if jax.process_index() == 0:
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "references.txt").is_file():
      write_lines(folder / "references.txt", references)
    write_lines(folder / "last.hyp", hyps)
    atomic.write_text(folder / "last.json", json.dumps(
        {"step": step, "bleu": score.bleu, "chrf": score.chrf}))


def keep_best_validation(workdir: str | Path):
  """The last validation's translations kept as the best's (`validation/best.*`: those of
  the best checkpoint)."""
  folder = Path(workdir) / VALIDATION
  if jax.process_index() == 0 and (folder / "last.json").is_file():
    for suffix in (".hyp", ".json"):
      atomic.write_text(folder / f"best{suffix}", (folder / f"last{suffix}").read_text())


def result_record(label: str, steps: list[int], data: str, score, sentences: int,
                  seconds: float, decode: DecodeConfig, program_seconds: float = 0.0) -> dict:
  """One entry of results.json: what was scored (checkpoint label and steps, data), the
  sacreBLEU scores with their signatures, the decoding settings and the speed: the decoding's
  wall time (`seconds`), the part of it spent preparing programs (`program_seconds`: tracing,
  lowering, compiling or loading them; once per process and shape), and sentences per second
  of the rest, the speed of the search itself."""
  return {"label": label, "steps": list(steps), "data": data, "sentences": sentences,
          "bleu": score.bleu, "bleu_signature": score.bleu_signature, "chrf": score.chrf,
          "chrf_signature": score.chrf_signature,
          "sentences_per_sec": sentences / max(seconds - program_seconds, 1e-9),
          "seconds": seconds, "program_seconds": program_seconds,
          "decode": dataclasses.asdict(decode)}


def read_results(out_dir: Path) -> list[dict]:
  path = Path(out_dir) / RESULTS
  return read_json(path) if path.is_file() else []


def with_added_decode_keys(decode: dict) -> dict:
  """A recorded config.decode with the keys added since it was written, at their values for
  older runs (so that the same settings compare equal across versions)."""
  return _with_added_keys({"decode": dict(decode)})["decode"]


def write_results(out_dir: Path, records: list[dict]) -> Path:
  """Adds `records` to `out_dir`/results.json; a record of the same checkpoint label, set and
  decoding settings replaces the earlier one, all others are kept."""
  key = lambda r: (r["label"], r["data"],  # noqa: E731
                   json.dumps(with_added_decode_keys(r["decode"]), sort_keys=True))
  new = {key(r) for r in records}
  kept = [r for r in read_results(out_dir) if key(r) not in new]
  path = Path(out_dir) / RESULTS
  if jax.process_index() == 0:
    atomic.write_json(path, kept + records, indent=2)
  return path
