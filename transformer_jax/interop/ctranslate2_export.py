"""A trained run's checkpoint selection as a CTranslate2 model folder: the converted weights
(model.bin, config.json, shared_vocabulary.json), the SentencePiece model (sentencepiece.model;
an imported Marian model's source.spm and target.spm), `export.json` (what was exported from
where) and a README of its provenance and use.

The folder is written under a temporary name beside `out` and renamed when complete: an
interrupted export leaves no half folder, and an existing one is replaced only with `force`.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
from importlib import metadata
from pathlib import Path

import jax
import numpy as np

from transformer_jax import atomic
from transformer_jax.config.model import FUNCTION, SHAPES, options
from transformer_jax.data.plan import data_plan
from transformer_jax.errors import UsageError
from transformer_jax.inference import trained_run
from transformer_jax.interop import ctranslate2_decoding, ctranslate2_model
from transformer_jax.model.transformer import unscanned
from transformer_jax.workdir import lock

log = logging.getLogger(__name__)

# CTranslate2's weight types (ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES)
QUANTIZATIONS = ("float32", "float16", "bfloat16", "int8", "int8_float32", "int8_float16",
                 "int8_bfloat16", "int16")
TOKENIZER_FILE = "sentencepiece.model"  # (a joint model's; see Tokenizer.sentencepiece_files)
EXAMPLES = {"de": "Ein Hund läuft durch den Schnee.", "en": "A dog runs through the snow.",
            "fr": "Un chien court dans la neige.", "cs": "Pes běží sněhem."}  # (the README's)


def load_ctranslate2():
  try:
    import ctranslate2  # (an optional extra: imported when an export runs)
  except ModuleNotFoundError:
    raise UsageError("transformer-jax-export needs CTranslate2: pip install "
                     "'transformer_jax[ctranslate2]' (or ctranslate2>=4.8)") from None
  return ctranslate2


def check_request(quantization: str, out: Path, force: bool):
  """A one-line UsageError for a quantization CTranslate2 has no weight type for, or an
  existing `out` without `force`."""
  if quantization not in QUANTIZATIONS:
    raise UsageError(f"--quantization={quantization!r}: CTranslate2 has no such weight type; "
                     f"expected one of {', '.join(QUANTIZATIONS)}")
  if out.exists() and not force:
    raise UsageError(f"--out={out} exists: pass --force to replace it")


def export(workdir: str | Path, checkpoint: str, out: str | Path, quantization: str = "float32",
           force: bool = False, wait_seconds: float = 0.0) -> dict:
  """Writes the CTranslate2 folder `out` for `checkpoint` of the run in `workdir`, holding the
  lock `.<out's name>.lock` beside it (one writer); returns the record written to its
  export.json. `wait_seconds`: how long to wait for another writer; a complete `out` found
  then is kept (a cache's entry that the other writer made), not exported again."""
  out = Path(out)
  check_request(quantization, out, force)
  ctranslate2 = load_ctranslate2()
  with lock.hold(out, "export", wait_seconds,
                 lock_path=out.with_name(f".{out.name}.lock")):
    if wait_seconds and (out / "export.json").is_file():
      return json.loads((out / "export.json").read_text())
    check_request(quantization, out, force)  # (again, holding the lock)
    return _export(workdir, checkpoint, out, quantization, ctranslate2)


def _export(workdir, checkpoint: str, out: Path, quantization: str, ctranslate2) -> dict:
  run = trained_run.load(workdir)
  # (as read: a damaged `latest` gives way to the newest checkpoint that restores)
  selected, params = run.read_params(run.select_one(checkpoint, "export"))
  # (writable copies: CTranslate2 quantizes in place)
  params = jax.tree_util.tree_map(lambda x: np.array(jax.device_get(x), np.float32), params)
  _, params = unscanned(run.model, params)
  spec = ctranslate2_model.build_spec(run.cfg.model, params, run.tokenizer)
  partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
  shutil.rmtree(partial, ignore_errors=True)
  try:
    ctranslate2_model.save(spec, partial, quantization)
    for name, data in run.tokenizer.sentencepiece_files().items():
      (partial / name).write_bytes(data)
    record = _record(run, selected, quantization, ctranslate2.__version__)
    (partial / "export.json").write_text(json.dumps(record, indent=2) + "\n")
    (partial / "README.md").write_text(readme(record, out.name))
    atomic.replace_folder(partial, out)  # (--force: the old export until the new one is in)
  finally:
    shutil.rmtree(partial, ignore_errors=True)
  log.info("Exported %s (%s) of %s to %s (%s)", selected.label, selected.steps, workdir, out,
           quantization)
  return record


def _record(run, selected, quantization: str, ctranslate2_version: str) -> dict:
  cfg = run.cfg
  tags = sorted(set(data_plan(cfg.data).tags)
                | set(run.tokenizer.language_tags))  # (an imported multilingual model's)
  return {
      "workdir": str(Path(run.workdir).resolve()),
      "checkpoint": selected.label,
      "steps": list(selected.steps),
      "weights": "raw" if selected.weights == "raw" or cfg.optimizer.ema_decay == 0 else "ema",
      "quantization": quantization,
      "tokenizer": {"files": sorted(run.tokenizer.sentencepiece_files()),
                    "fingerprint": run.tokenizer.fingerprint, "pieces": run.tokenizer.vocab_size},
      "source_tags": tags,
      "languages": [cfg.data.source_lang, cfg.data.target_lang],
      # (every option the weights depend on: model_options.ROWS says where each went)
      "model": {k: getattr(cfg.model, k) for k in options(SHAPES) + options(FUNCTION)},
      "translate_options": ctranslate2_decoding.translate_options(cfg.decode, cfg.model.max_len),
      "differences": ctranslate2_decoding.differences(cfg.decode),
      "ctranslate2": ctranslate2_version,
      "transformer_jax": metadata.version("transformer_jax"),
      "exported": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
  }


def readme(record: dict, folder: str) -> str:
  """The exported folder's README: where it comes from, and how to use it."""
  m = record["model"]
  options = ", ".join(f"{k}={v!r}" for k, v in record["translate_options"].items())
  tag = record["source_tags"][0] if record["source_tags"] else ""
  example = repr(EXAMPLES.get(record["languages"][0], "..."))
  files = record["tokenizer"]["files"]
  paired = files == ["source.spm", "target.spm"]  # (an imported Marian model's two models)
  source_sp, target_sp = ("source_sp", "target_sp") if paired else ("sp", "sp")
  tokens = f'["{tag}"] + {source_sp}.encode({example}, out_type=str)' if tag else \
      f"{source_sp}.encode({example}, out_type=str)"
  load = (f'source_sp = spm.SentencePieceProcessor("{folder}/source.spm")\n'
          f'target_sp = spm.SentencePieceProcessor("{folder}/target.spm")\n' if paired else
          f'sp = spm.SentencePieceProcessor("{folder}/{files[0]}")\n')
  lines = [
      f"# {folder}: a CTranslate2 model exported by transformer_jax",
      "",
      f"- Run: `{record['workdir']}`, checkpoint `{record['checkpoint']}` (steps "
      f"{record['steps']}, {record['weights']} weights)",
      f"- Model: {m['num_encoder_layers']}+{m['num_decoder_layers']} layers, d_model "
      f"{m['d_model']}, {m['num_heads']} heads ({m['num_kv_heads'] or m['num_heads']} key/value), "
      f"d_ff {m['d_ff']}, {'pre' if m['pre_layer_norm'] else 'post'}-LN {m['norm']}, "
      f"{m['ffn_activation']}, {m['positional_encoding']} positions (up to {m['max_len']}), "
      f"{m['vocab_size']}-row vocabulary; {record['languages'][0]} -> {record['languages'][1]}",
      f"- Weights: {record['quantization']} (CTranslate2 {record['ctranslate2']}); tokenizer "
      f"{', '.join(f'`{f}`' for f in files)} (fingerprint "
      f"{record['tokenizer']['fingerprint']})",
      f"- Exported {record['exported']} by transformer_jax {record['transformer_jax']}",
      "",
      "## Use",
      "```python",
      "import ctranslate2, sentencepiece as spm",
      f'{load}translator = ctranslate2.Translator("{folder}")',
      f"print({target_sp}.decode(translator.translate_batch([{tokens}])[0].hypotheses[0]))",
      "```",
      "(EOS is appended to each source by CTranslate2, as in training.)",
      "",
      "The run's decoding settings (`config.decode`) in CTranslate2's terms:",
      "",
      f"    translator.translate_batch(batch, {options})",
      "",
  ]
  if record["source_tags"]:
    lines += [f"A tagged run: each source starts with one of {record['source_tags']}.", ""]
  if record["differences"]:
    lines += ["Where CTranslate2 decodes differently:", ""]
    lines += [f"- {note}" for note in record["differences"]] + [""]
  return "\n".join(lines)
