"""CTranslate2 as the engine of a decoding tool: a run's checkpoint exported on the fly into
a cache keyed by its fingerprint (the run, the checkpoint's steps and weights and their files'
times, CTranslate2's version; reused while they are unchanged), translated with CTranslate2's
`translate_batch` as our search would be: the run's decoding settings with a request's
overrides (`ctranslate2_decoding.translate_options`), n-best with scores, empty lines kept."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

from transformer_jax.config.parse import replace_from_text
from transformer_jax.errors import ConfigError
from transformer_jax.export import ctranslate2_decoding, exporter
from transformer_jax.inference import trained_run
from transformer_jax.workdir import layout

log = logging.getLogger(__name__)


def cache_root() -> Path:
  return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
      "transformer_jax" / "ctranslate2"


def fingerprint(run, selected, version: str) -> str:
  """What the exported folder depends on, hashed."""
  times = []
  for step in selected.steps:
    for folder in (layout.CHECKPOINTS, layout.BEST_CHECKPOINTS):
      path = Path(run.workdir) / folder / str(step)
      if path.exists():
        times.append([str(path), path.stat().st_mtime_ns])
  record = {"workdir": str(Path(run.workdir).resolve()), "label": selected.label,
            "steps": list(selected.steps), "weights": selected.weights, "files": times,
            "ctranslate2": version}
  return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def cached_export(run, checkpoint: str) -> Path:
  """The float32 CTranslate2 folder of `checkpoint` of `run`, exported unless cached."""
  ctranslate2 = exporter.load_ctranslate2()
  selected = run.select_one(checkpoint, "the ctranslate2 engine")
  folder = cache_root() / fingerprint(run, selected, ctranslate2.__version__)
  if (folder / "export.json").is_file():
    log.info("CTranslate2 model of %s (%s) from the cache: %s", run.workdir, selected.label,
             folder)
    return folder
  folder.parent.mkdir(parents=True, exist_ok=True)
  # (the resolved selection: a step written meanwhile is not exported under this key)
  exporter.export(run.workdir, selected.label, folder, "float32", force=True)
  return folder


def compute_type(requested: str, device: str = "cpu") -> str:
  """`requested`, or by the hardware: bfloat16 where CTranslate2 has it on the device, else
  float32 (int8 only when asked: it changes translations beyond the export's agreement)."""
  import ctranslate2  # (the optional extra, as the exporter's)
  supported = ctranslate2.get_supported_compute_types(device)
  if requested:
    if requested not in supported:
      raise ConfigError(f"--compute_type={requested}: CTranslate2 on this {device} supports "
                        f"{', '.join(sorted(supported))}")
    return requested
  return "bfloat16" if "bfloat16" in supported else "float32"


class Ctranslate2Engine:
  """A run's checkpoint decoded by CTranslate2; the server's engine interface (see
  serving.engine.JaxEngine)."""
  name = "ctranslate2"

  def __init__(self, workdir: list[str], checkpoint: str = "latest", requested_type: str = "",
               source_tag: str = "", max_batch: int = 32, run=None):
    import ctranslate2
    if len(workdir) > 1:
      raise ConfigError("--engine=ctranslate2 takes one --workdir (no ensembles)")
    run = run or trained_run.load(workdir[0])
    self.sp, self.source_tag = run.tokenizer.sp, source_tag
    self.decode, self.max_len, self.max_batch = run.cfg.decode, run.cfg.model.max_len, max_batch
    self.source_lang, self.target_lang = run.cfg.data.source_lang, run.cfg.data.target_lang
    self.beam_size = self.decode.beam_size
    self.compute_type = compute_type(requested_type)
    self.translator = ctranslate2.Translator(str(cached_export(run, checkpoint)), device="cpu",
                                             compute_type=self.compute_type,
                                             intra_threads=os.cpu_count() or 1)
    log.info("CTranslate2 engine: %s", self.compute_type)

  def decode_config(self, options):
    if options.alignments:
      raise ConfigError("alignments: not with the ctranslate2 engine (use --engine=jax)")
    return replace_from_text(self.decode, [f"{k}={v}" for k, v in options.decode], "decode")

  def translate(self, sentences: list[str], prefixes: list[str], options) -> list[list[dict]]:
    return self.translated(sentences, prefixes, self.decode_config(options), options.seed)

  def translated(self, sentences: list[str], prefixes: list[str], decode,
                 seed: int | None = None) -> list[list[dict]]:
    """`translate` with `decode` (config.decode) itself."""
    import ctranslate2
    todo = [i for i, s in enumerate(sentences) if s.strip()]
    out: list[list[dict]] = [[] for _ in sentences]
    if not todo:
      return out
    if seed is not None:
      ctranslate2.set_random_seed(seed)
    tokens = [([self.source_tag] if self.source_tag else [])
              + self.sp.encode(sentences[i], out_type=str) for i in todo]
    prefix = [self.sp.encode(prefixes[i], out_type=str) if prefixes[i] else None
              for i in todo] if any(prefixes) else None
    results = self.translator.translate_batch(
        tokens, target_prefix=prefix, max_batch_size=self.max_batch, batch_type="examples",
        **{**ctranslate2_decoding.translate_options(decode, self.max_len),
           "return_scores": True})
    for i, result in zip(todo, results):
      out[i] = [{"translation": self.sp.decode(h), "score": float(s)}
                for h, s in zip(result.hypotheses, result.scores)]
    return out

  def warm_up(self, chunks: int = 0) -> int:
    """(CTranslate2 compiles nothing: one sentence loads its kernels)"""
    self.translator.translate_batch([self.sp.encode("Ein Test.", out_type=str)])
    return 1


def evaluation_engines(names: list[str], requested_type: str = "", source_tag: str = "") -> dict:
  """`evaluate --engine`'s engines: {name: None (our search) or a translate function}."""
  unknown = sorted(set(names) - {"jax", "ctranslate2"})
  if unknown:
    raise ConfigError(f"--engine={','.join(names)}: {unknown[0]!r} is no engine; expected jax "
                      "and/or ctranslate2")
  return {name: None if name == "jax" else evaluation(requested_type, source_tag)
          for name in names}


def evaluation(requested_type: str = "", source_tag: str = ""):
  """`evaluate`'s translate function for CTranslate2 (see
  inference.checkpoint_eval.evaluate_checkpoints): the selected checkpoint's export (cached)
  translating the set's sources with `decode`, in its batch size; returns the translations
  and the seconds spent exporting (or finding the export) and loading it."""
  def translate(run, selected, eval_set, decode) -> list[str]:
    if eval_set.source_prefix and not source_tag:
      raise ConfigError("--engine=ctranslate2: a tagged set needs --source_tag (the tag "
                        "before every source)")
    start = time.time()
    engine = Ctranslate2Engine([str(run.workdir)], selected.label, requested_type,
                               source_tag, decode.batch_size, run=run)
    prepared = time.time() - start  # (the export or the cache, and loading)
    results = engine.translated(eval_set.sources, [""] * len(eval_set.sources), decode)
    return [r[0]["translation"] if r else "" for r in results], prepared
  return translate
