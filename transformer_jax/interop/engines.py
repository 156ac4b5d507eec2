"""The engines a decoding tool (translate, translate-corpus, evaluate, serve, the benchmarks)
chooses with `--engine`: our search (`decoding.engine.SearchEngine`) or CTranslate2
(`Ctranslate2Engine`, the same `decoding.engine.Engine` protocol): a run's checkpoint exported
on the fly into a cache keyed by its fingerprint (the run, the checkpoint's steps and weights
and their files' times, CTranslate2's version, this package's source as the program store
keys its programs; reused while they are unchanged), decoded by CTranslate2's
`translate_batch` with the run's decoding settings and the tool's overrides as CTranslate2
honours them (`ctranslate2_decoding.translate_options`), n-best with scores."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from transformer_jax.config.parse import replace_from_text
from transformer_jax.data.tokenizer import EOS_ID
from transformer_jax.decoding.batches import Hypothesis, caps_of_lengths
from transformer_jax.decoding.engine import Engine
from transformer_jax.decoding.mbr import mbr_chosen
from transformer_jax.errors import ConfigError, UsageError
from transformer_jax.inference import trained_run
from transformer_jax.inference.translator import Translator
from transformer_jax.interop import ctranslate2_decoding, ctranslate2_export
from transformer_jax.parallel import program_store
from transformer_jax.workdir import layout

log = logging.getLogger(__name__)

ENGINES = ("jax", "ctranslate2")
EXPORT_WAIT_S = 600  # (another process exporting the same checkpoint: wait for its folder)


def cache_root() -> Path:
  return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / \
      "transformer_jax" / "ctranslate2"


def fingerprint(run, selected, version: str) -> str:
  """What the exported folder depends on, hashed (not the selection's name: `latest` and the
  step it names share an export). The package's source is in it: the converter's code is, and
  a version that exports differently must not be served the folder an earlier one wrote."""
  times = []
  for step in selected.steps:
    for folder in (layout.CHECKPOINTS, layout.BEST_CHECKPOINTS):
      path = Path(run.workdir) / folder / str(step)
      if path.exists():
        times.append([str(path), path.stat().st_mtime_ns])
  # (the weights resolved: "auto" and the one it means share an export)
  ema = selected.weights != "raw" and run.cfg.optimizer.ema_decay > 0
  record = {"workdir": str(Path(run.workdir).resolve()), "steps": list(selected.steps),
            "weights": "ema" if ema else "raw", "files": times, "ctranslate2": version,
            "source": program_store.source_digest()}
  return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:16]


def cached_export(run, selected) -> Path:
  """The float32 CTranslate2 folder of the `selected` checkpoint of `run`, exported unless
  cached; a process exporting the same checkpoint meanwhile is waited for."""
  ctranslate2 = ctranslate2_export.load_ctranslate2()
  folder = cache_root() / fingerprint(run, selected, ctranslate2.__version__)
  if not (folder / "export.json").is_file():
    folder.parent.mkdir(parents=True, exist_ok=True)
    # (a process exporting it meanwhile is waited for, and its folder taken)
    ctranslate2_export.export(run.workdir, selected.label, folder, "float32", force=True,
                              wait_seconds=EXPORT_WAIT_S)
    return folder
  log.info("CTranslate2 model of %s (%s) from the cache: %s", run.workdir, selected.label,
           folder)
  return folder


def compute_type(requested: str, device: str = "cpu") -> str:
  """`requested`, or by the hardware: bfloat16 where CTranslate2 has it on the device, else
  float32 (int8 only when asked: it changes translations beyond the export's agreement)."""
  import ctranslate2  # (the optional extra, as ctranslate2_export's)
  supported = ctranslate2.get_supported_compute_types(device)
  if requested:
    if requested not in supported:
      raise ConfigError(f"--compute_type={requested}: CTranslate2 on this {device} supports "
                        f"{', '.join(sorted(supported))}")
    return requested
  return "bfloat16" if "bfloat16" in supported else "float32"


class Ctranslate2Engine(Engine):
  """CTranslate2 as a decoding engine: an exported folder (one model: no ensembles, no
  alignments) decoded by `translate_batch` with `decode` as CTranslate2 honours it
  (`settings`): each group of sentences of one length cap (ours:
  `decoding.batches.sentence_caps`) translated with that `max_decoding_length`, MBR's
  candidates ordered as ours orders them. `compute_type` as `compute_type()`'s;
  `calls_at_once`: the calls from different threads it runs at once (CTranslate2's
  inter_threads, the cores shared between them); `backend`: its `ctranslate2.Translator`."""
  name = "ctranslate2"
  # (CTranslate2 seeds each worker thread's generator once, at its first sample: a later
  # set_random_seed changes nothing, so only a process's first sampling call has its seed)
  seeds_each_call = False

  def __init__(self, folder: str | Path, tokenizer, decode, max_len: int,
               source_prefix=(), compute_type: str = "float32", calls_at_once: int = 1):
    import ctranslate2
    self.tokenizer, self.decode, self.source_prefix = tokenizer, decode, tuple(source_prefix)
    self.max_len = max_len  # (max_input_length: CTranslate2 cuts there)
    self.eos_piece = tokenizer.pieces([EOS_ID])[0]  # (how CTranslate2 says a hypothesis ended)
    self.told: set[str] = set()  # (the differences from ours said: each once)
    self.compute_type = compute_type
    self.backend = ctranslate2.Translator(
        str(folder), device="cpu", compute_type=compute_type, inter_threads=calls_at_once,
        intra_threads=max(1, (os.cpu_count() or 1) // calls_at_once))
    log.info("CTranslate2 engine: %s", compute_type)

  @property
  def label(self) -> str:
    return f"{self.name}:{self.compute_type}"

  def translate_set(self, eval_set, decode=None, on_batch=None):
    import ctranslate2
    decode = decode or self.decode
    self.check(decode)
    if decode.sampling:
      ctranslate2.set_random_seed(decode.seed)
    settings = self.settings(decode)
    for note in set(settings["differences"]) - self.told:
      log.warning("--engine=ctranslate2: %s", note)
      self.told.add(note)
    options = settings["translate_batch"]
    # (the set's ids as CTranslate2's pieces: its tag's included, EOS not)
    tokens = [self.tokenizer.pieces(ids[:-1] if len(ids) and ids[-1] == EOS_ID else ids)
              for ids in eval_set.source_ids]
    prefix = (None if eval_set.prefix_ids is None or not any(len(p) for p in eval_set.prefix_ids)
              else [self.tokenizer.pieces(p) for p in eval_set.prefix_ids])
    caps = self._caps(decode, tokens, prefix)
    out: list[list[Hypothesis]] = [[] for _ in tokens]
    chunk = decode.batch_size * 16  # (CTranslate2 sorts each call's sentences by length)
    for cap in sorted(set(caps)):
      group = [i for i, c in enumerate(caps) if c == cap]
      for start in range(0, len(group), chunk):
        rows = group[start:start + chunk]
        results = self.backend.translate_batch(
            [tokens[i] for i in rows],
            target_prefix=None if prefix is None else [prefix[i] or None for i in rows],
            batch_type="examples", **{**options, "max_decoding_length": cap,
                                      "min_decoding_length": min(decode.min_length, cap)})
        for i, result in zip(rows, results):
          out[i] = self._nbest(decode, [self._hypothesis(pieces, score) for pieces, score
                                        in zip(result.hypotheses, result.scores)])
        if on_batch is not None:
          on_batch(len(rows))
    return out

  def settings(self, decode) -> dict:
    """What CTranslate2 runs for `decode`: the `translate_batch` keywords (each call's
    `max_decoding_length` at most the one here: its sentences' cap) and what it does
    differently from ours (`ctranslate2_decoding.differences`)."""
    return {"translate_batch": {**ctranslate2_decoding.translate_options(decode, self.max_len),
                                "return_end_token": True},  # (whether each ended)
            "differences": ctranslate2_decoding.differences(decode, around_the_call=True)}

  def _caps(self, decode, tokens: list[list[str]], prefixes: list[list[str]] | None
            ) -> list[int]:
    """Each sentence's length cap as our search gives it (sources of `tokens` and EOS, cut
    at the model's positions as the search cuts them; prefixes of `prefixes`)."""
    caps = caps_of_lengths(decode, [min(len(t) + 1, self.max_len) for t in tokens],
                           None if prefixes is None else [len(p) for p in prefixes],
                           self.max_len)
    return [int(cap) for cap in caps]

  def _nbest(self, decode, hyps: list[Hypothesis]) -> list[Hypothesis]:
    """A sentence's n-best as our search returns it: with MBR, CTranslate2's candidates
    ordered as ours orders them (`mbr_chosen`), the first `nbest`."""
    return mbr_chosen(hyps, decode.mbr, decode.nbest) if decode.mbr else hyps

  def _hypothesis(self, pieces: list[str], score: float) -> Hypothesis:
    """A CTranslate2 hypothesis (asked with its end token) as our search's: ended when it
    ends in EOS, which the ids leave out."""
    ended = bool(pieces) and pieces[-1] == self.eos_piece
    ids = self.tokenizer.piece_ids(pieces[:-1] if ended else pieces)
    return Hypothesis(self.tokenizer.detokenize(ids), float(score), tuple(ids), ended)

  def warm_up(self):
    """(CTranslate2 compiles nothing: one sentence loads its kernels)"""
    self.backend.translate_batch([self.tokenizer.pieces(self.source_prefix)
                                     + self.tokenizer.encode_pieces("Ein Test.")])


def ctranslate2_translator(workdir: str | list[str], checkpoint: str = "latest",
                           decode_overrides=(), source_tag: str = "",
                           requested_type: str = "", run=None,
                           calls_at_once: int = 1) -> Translator:
  """A Translator of the CTranslate2 engine over one run's `checkpoint`, exported into the
  cache on first use (`cached_export`); the run's decoding settings with
  `decode_overrides`."""
  workdirs = [workdir] if isinstance(workdir, (str, Path)) else list(workdir)
  if len(workdirs) > 1:
    raise UsageError("--engine=ctranslate2 takes one --workdir (no ensembles)")
  run = run or trained_run.load(workdirs[0])
  decode = replace_from_text(run.cfg.decode, list(decode_overrides), "decode")
  Ctranslate2Engine.check(decode)  # (before the export)
  selected = run.select_one(checkpoint, "the ctranslate2 engine")
  engine = Ctranslate2Engine(cached_export(run, selected), run.tokenizer, decode,
                             run.cfg.model.max_len, run.source_prefix(source_tag),
                             compute_type(requested_type), calls_at_once)
  return Translator.over(engine, run, selected)


def translator(engine: str, workdir, checkpoint: str = "latest", decode_overrides=(),
               source_tag: str = "", dtype: str = "", compute_type: str = "",
               alignments: bool = False, alignment_layer: int | None = None,
               calls_at_once: int = 1) -> Translator:
  """The `--engine` flag's translator: our search (jax) or CTranslate2, each refusing the
  other's flags in one line; `calls_at_once`: CTranslate2's calls from threads run at once
  (our search runs each thread's call as it comes)."""
  check_flags([engine], dtype, compute_type, alignments, alignment_layer)
  if engine == "ctranslate2":
    return ctranslate2_translator(workdir, checkpoint, decode_overrides, source_tag,
                                  compute_type, calls_at_once=calls_at_once)
  return Translator(workdir, checkpoint, decode_overrides, source_tag, dtype, alignments,
                    alignment_layer)


def check_flags(engines: list[str], dtype: str = "", compute_type: str = "",
                alignments: bool = False, alignment_layer: int | None = None):
  """A UsageError naming the first flag given that none of `engines` takes (our search's
  --dtype, --alignments and --alignment_layer; CTranslate2's --compute_type)."""
  if "jax" not in engines:
    for flag, given in (("--dtype", dtype), ("--alignments", alignments),
                        ("--alignment_layer", alignment_layer is not None)):
      if given:
        raise UsageError(f"{flag}: not with --engine=ctranslate2 (use --compute_type; "
                         "alignments come from our search)")
  if "ctranslate2" not in engines and compute_type:
    raise UsageError("--compute_type is CTranslate2's: with --engine=ctranslate2 (our search "
                     "takes --dtype)")


def evaluation_engines(names: list[str], requested_type: str = "", dtype: str = "") -> dict:
  """`evaluate --engine`'s engines: {name: None (our search) or a function making the engine
  of a run's selected checkpoint (see inference.checkpoint_eval.evaluate_checkpoints)}; a
  flag that none of them takes (`check_flags`: `requested_type` is --compute_type) refused."""
  unknown = sorted(set(names) - set(ENGINES))
  if unknown:
    raise ConfigError(f"--engine={','.join(names)}: {unknown[0]!r} is no engine; expected jax "
                      "and/or ctranslate2")
  check_flags(names, dtype, requested_type)
  return {name: None if name == "jax" else evaluation(requested_type) for name in names}


def evaluation(requested_type: str = ""):
  """`evaluate`'s maker of the CTranslate2 engine: the selected checkpoint's export (cached),
  reading `decode` and the run's positions (the set's ids carry their tag)."""
  def make(run, selected, decode) -> Ctranslate2Engine:
    return Ctranslate2Engine(cached_export(run, selected), run.tokenizer, decode,
                             run.cfg.model.max_len, compute_type=compute_type(requested_type))
  return make
