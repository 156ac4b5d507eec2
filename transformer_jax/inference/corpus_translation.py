"""Translating a whole text file into a parallel corpus folder: back-translation (a reverse
model on target-language text) and distillation (a teacher, or an ensemble, on a corpus's
source side) — the synthetic training data of a mixture.

The output folder holds `{split}.{L1}` (the input, line for line) and `{split}.{L2}` (its
translations) for the model's languages L1 -> L2, plus `translation.json`: the model
(workdirs, checkpoint, tokenizer fingerprint), the decoding settings, the input's fingerprint,
the counts, and the tag to use for it in a mixture. Every input line gives one line on each
side: an empty line, one that is not UTF-8 or one longer than the model's positions gives an
empty pair (which training drops) and is counted.

The input is translated in blocks of `block_lines`, each on its own (its batches, its sampling
seed), appended to both files (`.NAME.partial` until the last block, so a corpus reader never
takes half a folder) and made durable before `progress.json` records it. A killed run rerun
with the same command truncates the files to the last recorded block and goes on, so the
folder ends byte for byte as an uninterrupted run's; a finished one is left as it is.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

from transformer_jax import atomic
from transformer_jax.errors import DataError, Interrupted, UsageError
from transformer_jax.inference.translator import Translator
from transformer_jax.reporting.progress import hms
from transformer_jax.workdir import layout

log = logging.getLogger(__name__)

RECORD, PROGRESS = "translation.json", "progress.json"
# Settings recorded since a later version, with the value older folders were translated with.
ADDED_SETTINGS = {"engine": "jax"}


def _raw_lines(path: Path) -> Iterator[bytes]:
  if not path.is_file():
    raise DataError(f"input file {path} does not exist")
  with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
    for raw in f:
      yield raw.rstrip(b"\r\n")


def _file_fingerprint(path: Path) -> str:
  st = path.stat()
  return hashlib.sha256(f"{path.resolve()}|{st.st_size}|{int(st.st_mtime)}".encode()
                        ).hexdigest()[:16]


@dataclasses.dataclass
class Counts:
  lines: int = 0
  empty: int = 0
  invalid: int = 0      # not UTF-8
  too_long: int = 0     # more subwords than the model has positions


def _usable(raw: bytes, translator: Translator, counts: Counts) -> str:
  """The line's text when it can be translated, else "" (counted)."""
  try:
    text = raw.decode("utf-8").strip()
  except UnicodeDecodeError:
    counts.invalid += 1
    return ""
  if not text:
    counts.empty += 1
  elif (len(translator.source_prefix) + len(translator.run.tokenizer.encode(text))
        > translator.max_len):  # (the tag, the pieces and EOS; an ensemble's shortest reach)
    counts.too_long += 1
    return ""
  return text


def auto_block_lines(total_lines: int) -> int:
  """Lines per block when none is given: about a twentieth of the input (a killed run redoes
  at most that), a multiple of 64 from 64 to 2,048 (long inputs: batches of similar lengths)."""
  return min(2048, max(64, -(-total_lines // 20 // 64) * 64))


def translate_corpus(translator: Translator, workdirs: list[str], checkpoint: str,
                     input_path: str, out: str, split: str = "train", tag: str = "",
                     block_lines: int = 0) -> dict:
  """Translates `input_path` into the parallel folder `out` (resuming a killed run there) in
  blocks of `block_lines` (0: `auto_block_lines`); returns the record written to
  `translation.json`. SIGTERM or Ctrl-C (as errors.Interrupted or KeyboardInterrupt) stops it
  with what is saved said."""
  input_path, out = Path(input_path), Path(out)
  total = sum(1 for _ in _raw_lines(input_path))  # (one pass: the block size, the ETA)
  block_lines = block_lines or _recorded_block_lines(out) or auto_block_lines(total)
  run = translator.run
  src_lang, tgt_lang = run.cfg.data.source_lang, run.cfg.data.target_lang
  settings = {"workdirs": [str(Path(w).resolve()) for w in workdirs], "checkpoint": checkpoint,
              "checkpoint_labels": translator.labels, "checkpoint_steps": translator.steps,
              "tokenizer": run.tokenizer.fingerprint, "source_prefix": translator.source_prefix,
              "decode": dataclasses.asdict(translator.decode),
              "input": str(input_path.resolve()), "input_fingerprint":
              _file_fingerprint(input_path) if input_path.is_file() else "",
              "split": split, "languages": [src_lang, tgt_lang], "block_lines": block_lines,
              "engine": translator.engine.label}
  final = {lang: out / f"{split}.{lang}" for lang in (src_lang, tgt_lang)}
  if (out / RECORD).is_file() and all(p.is_file() for p in final.values()):
    record = json.loads((out / RECORD).read_text())
    changed = _changed(record, {**settings, "tag": tag})
    if not changed:
      log.info("%s holds this translation already (%s)", out, out / RECORD)
      return record
    raise UsageError(f"--out={out} holds a finished translation with other "
                     f"{', '.join(changed)}: choose another folder")
  # (written under other names until complete: a corpus reader never sees half a folder)
  files = {lang: out / f".{path.name}.partial" for lang, path in final.items()}
  done, sizes, counts = _resume(out, settings, files, final)
  lines = _raw_lines(input_path)
  for _ in range(done):
    next(lines, None)
  start, first = time.perf_counter(), done
  handles = {lang: open(path, "ab") for lang, path in files.items()}
  try:
    while True:
      block = [raw for _, raw in zip(range(block_lines), lines)]
      if not block:
        break
      block_counts = Counts(lines=len(block))
      texts = [_usable(raw, translator, block_counts) for raw in block]
      seed = (translator.decode.seed * 1_000_003 + done // block_lines) % 2**31
      hyps = translator.translate(texts, seed=seed)
      for lang, side in ((src_lang, texts), (tgt_lang, [h[0].text if h and t else ""
                                                         for h, t in zip(hyps, texts)])):
        handles[lang].write("".join(line.replace("\n", " ") + "\n" for line in side
                                    ).encode("utf-8"))
        handles[lang].flush()
        os.fsync(handles[lang].fileno())
        sizes[lang] = handles[lang].tell()
      done += len(block)
      for key in dataclasses.fields(Counts):
        setattr(counts, key.name, getattr(counts, key.name) + getattr(block_counts, key.name))
      _write_json(out / PROGRESS, {"settings": settings, "lines_done": done, "bytes": sizes,
                                   "counts": dataclasses.asdict(counts)})
      rate = (done - first) / max(time.perf_counter() - start, 1e-9)
      log.info("translated %d/%d lines (%.1f%%, %.1f lines/s, ETA %s)", done, total,
               100 * done / max(total, 1), rate, hms((total - done) / max(rate, 1e-9)))
  except (Interrupted, KeyboardInterrupt) as e:
    raise Interrupted(f"{str(e) or 'interrupted'}: {done} of {total} lines translated and saved in "
                      f"{out}; rerun the same command to go on") from None
  finally:
    for handle in handles.values():
      handle.close()
  for lang, path in files.items():
    os.replace(path, final[lang])
  record = {**settings, "tag": tag, "counts": dataclasses.asdict(counts),
            "files": {lang: path.name for lang, path in final.items()},
            "use_in_a_mixture": {"data_dir": str(out.resolve()), "split": split, "tag": tag}}
  _write_json(out / RECORD, record)
  log.info("%s: %d lines (%d empty, %d not UTF-8, %d too long: empty pairs)", out,
           counts.lines, counts.empty, counts.invalid, counts.too_long)
  return record


def _resume(out: Path, settings: dict, files: dict[str, Path], final: dict[str, Path]
            ) -> tuple[int, dict[str, int], Counts]:
  """(lines done, bytes of each file, counts) of a translation in `out` with these
  settings, its files cut back to the last recorded block; an error for other settings."""
  out.mkdir(parents=True, exist_ok=True)
  progress = out / PROGRESS
  if not progress.is_file():
    if any(path.exists() for path in final.values()):
      raise UsageError(f"--out={out} holds {', '.join(p.name for p in final.values())} not "
                       "written by this tool: choose another folder")
    for path in files.values():
      path.write_bytes(b"")
    return 0, dict.fromkeys(files, 0), Counts()
  try:
    state = json.loads(progress.read_text())
    recorded, done, sizes = state["settings"], int(state["lines_done"]), state["bytes"]
    counts = Counts(**state["counts"])
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise DataError(f"{progress} is damaged ({e}): delete {out} to translate again") from None
  changed = _changed(recorded, settings)
  if changed:
    raise UsageError(f"--out={out} holds a translation with other {', '.join(changed)}: "
                     "rerun it with the same arguments, or choose another folder")
  for lang, path in files.items():
    if not path.is_file() or path.stat().st_size < sizes[lang]:
      raise DataError(f"{path} is shorter than {progress} records: delete {out} to translate "
                      "again")
    os.truncate(path, sizes[lang])  # (a block written after the last record is redone)
  if done:
    log.info("resuming %s after %d lines", out, done)
  return done, dict(sizes), counts


def _recorded_block_lines(out: Path) -> int:
  """The block size a translation begun in `out` was given (0 if none is there): a rerun
  without --block_lines goes on with it, whatever the default."""
  for path, settings in ((out / PROGRESS, "settings"), (out / RECORD, None)):
    try:
      record = json.loads(path.read_text())
      return int((record[settings] if settings else record)["block_lines"])
    except (OSError, ValueError, KeyError, TypeError):
      continue
  return 0


def _changed(recorded: dict, settings: dict) -> list[str]:
  """The settings whose recorded values differ (decoding keys added since the record was
  written count at their values for older runs)."""
  recorded = {**recorded, "decode": layout.with_added_decode_keys(recorded.get("decode", {}))}
  return [k for k in settings if recorded.get(k, ADDED_SETTINGS.get(k)) != settings[k]]


def _write_json(path: Path, value: dict):
  atomic.write_json(path, value, indent=1, ensure_ascii=False)
