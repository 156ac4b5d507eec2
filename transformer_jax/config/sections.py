"""The sections of a run's config as typed dataclasses, each field commented and checked.

`config.model` maps onto `ModelConfig`, `config.data` onto `DataConfig`, and so on, one to one
(see `parse.from_config_dict`), so a misspelt or ill-typed key fails before anything is built.
The fields have no defaults: the shipped config files (`configs/default.py` and the files built
on it) are the one place where values live. Nothing heavy is imported here.
"""

from __future__ import annotations

import dataclasses

from transformer_jax.config.checks import check_choice, check_positive
from transformer_jax.config.corpora import (
  CleaningConfig,
  CorpusConfig,
  SubwordSamplingConfig,
  parse_nested,
)
from transformer_jax.config.fields import (
  ByEngine,
  check_choices,
  check_ranges,
  declared,
  option,
)
from transformer_jax.config.model import ModelConfig
from transformer_jax.config.population import PopulationConfig
from transformer_jax.errors import ConfigError

MESH_AXES = ("data", "fsdp", "tensor")     # the device mesh's axes, in mesh_shape's order
# config.optimizer.weight_decay_exclude's rule by rank, not name: what runs did before the key
DECAY_BY_RANK = "ndim<2"


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """Where the corpus lives and how batches are made (`config.data`)."""
  dataset: str                  # "local" (a folder of {split}.{lang}[.gz]) or a TFDS name
  data_dir: str                 # the local folder; "" = the embedded Multi30k corpus
  source_lang: str              # the language translated from (its files' suffix)
  target_lang: str              # the language translated into
  train_split: str              # the split trained on
  eval_split: str               # validation loss and BLEU during training ("" in a mixture
                                # whose corpora name theirs: their mean BLEU picks the best)
  test_split: str               # BLEU at the end of training ("" to skip)
  eval_dataset: str             # TFDS name of eval_split when it differs; "" = dataset
  test_dataset: str             # TFDS name of test_split when it differs; "" = dataset
  cache_dir: str                # prepared TFDS datasets; "" = ~/.cache/transformer_jax/tfds
  tokenizer_path: str           # SentencePiece model; "" = <workdir>/spm.model
  tokenizer_max_sentences: int  # sentences sampled to train the tokenizer
  tokenizer_max_chars: int      # characters of those sentences read at most (0 = no limit)
  max_source_length: int        # source tokens (EOS included); longer pairs are filtered out
  max_target_length: int        # target tokens, the same (both: the packed rows' lengths)
  batch_size: int               # packed rows per global batch
  num_threads: int              # grain reader threads
  prefetch_buffer_size: int     # pairs read ahead
  # read the training split as ids tokenized once (cached); False: tokenize the text at every epoch
  # (the older path)
  pretokenize: bool = declared(before=False)
  # grain worker processes packing batches (0 = in-process); the batch order depends on it: keep it
  # to resume exactly
  num_workers: int = declared(before=0)
  corpora: dict = dataclasses.field(default_factory=dict, hash=False)  # NAME -> CorpusConfig:
                                # train on a mixture of these, not the corpus above ({} = it)
  cleaning: object = dataclasses.field(default_factory=CleaningConfig)  # CleaningConfig
  subword_sampling: object = dataclasses.field(  # SubwordSamplingConfig: a new segmentation
      default_factory=SubwordSamplingConfig)     # of each training pair at every epoch

  def __post_init__(self):
    if self.source_lang == self.target_lang:
      raise ConfigError(f"config.data.source_lang and target_lang are both "
                        f"{self.source_lang!r}")
    object.__setattr__(self, "cleaning", parse_nested(CleaningConfig, self.cleaning,
                                                      "config.data.cleaning"))
    object.__setattr__(self, "subword_sampling", parse_nested(
        SubwordSamplingConfig, self.subword_sampling, "config.data.subword_sampling"))
    if self.subword_sampling.active and self.corpora:
      raise ConfigError("config.data.subword_sampling is not supported with config.data.corpora "
                        "(a mixture) yet: train one corpus with it")
    if self.subword_sampling.active and not self.pretokenize:
      raise ConfigError("config.data.subword_sampling needs config.data.pretokenize=True (it "
                        "samples from the stored pairs)")
    if not isinstance(self.corpora, dict):
      raise ConfigError("config.data.corpora must be a section of named corpora")
    object.__setattr__(self, "corpora", {
        name: parse_nested(CorpusConfig, entry, f"config.data.corpora.{name}").resolved(
            name, self) for name, entry in self.corpora.items()})
    seen = {}
    for name, c in self.corpora.items():  # (e.g. a back-translated corpus left without data)
      same = seen.setdefault((c.dataset, c.data_dir, c.source_lang, c.target_lang, c.split),
                             name)
      if same != name:
        folder = repr(c.data_dir) if c.data_dir else "'' = the embedded corpus"
        raise ConfigError(
            f"config.data.corpora.{same} and .{name} read the same data (dataset "
            f"{c.dataset!r}, data_dir {folder}, {c.source_lang}-{c.target_lang}, split "
            f"{c.split!r}): give one its own data_dir")
    if self.corpora and not (self.eval_split or any(c.eval_split
                                                    for c in self.corpora.values())):
      raise ConfigError("config.data.eval_split is '' and no corpus of config.data.corpora "
                        "names an eval_split: nothing to validate on")
    if self.corpora and not self.pretokenize:
      raise ConfigError("config.data.corpora (a mixture) needs config.data.pretokenize=True")
    check_positive("data", self, ("max_source_length", "max_target_length", "batch_size",
                                  "num_threads"))
    if self.num_workers < 0:
      raise ConfigError(f"config.data.num_workers={self.num_workers} must be >= 0")


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """AdamW and its learning-rate schedule (`config.optimizer`)."""
  learning_rate: float          # peak, reached at the end of warmup
  warmup_steps: int             # linear warmup from 0, then the schedule
  # after warmup: "inverse_sqrt" (lr * sqrt(warmup / step), the paper's), "cosine" or "linear"
  # (towards 0 at num_train_steps), "constant"; the cooldown below applies on top of any
  schedule: str = declared(before="inverse_sqrt")
  b1: float                     # Adam's decay rate of the first moment
  b2: float                     # Adam's decay rate of the second moment
  eps: float                    # Adam's epsilon, added to the second moment's root
  # decoupled (AdamW), on every parameter that weight_decay_exclude does not name
  weight_decay: float
  # the parameters weight decay leaves alone: glob patterns matched against each parameter's path
  # (e.g. "decoder_0/ffn_block/layer_norm/scale"; `*` crosses "/"): by default biases (the
  # relative-position tables and the output bias included) and norm scales; kernels and embeddings
  # decay. "ndim<2" (runs from before this key) leaves out every parameter of fewer than two axes
  # instead, whatever its name
  weight_decay_exclude: tuple[str, ...] = declared(before=(DECAY_BY_RANK,))
  grad_clip_norm: float         # global-norm clipping; 0 disables
  # > 0: keep an exponential moving average of the parameters (decay per step, e.g. 0.999), used for
  # validation, the test and the tools; 0 = off
  ema_decay: float = declared(before=0.0)
  # the learning rate decays linearly to 0 over the last fraction of training: of num_train_steps,
  # or of time_budget_minutes when that ends first (warmup-stable-decay); 0 = no cooldown
  cooldown_fraction: float = declared(before=0.0)

  def __post_init__(self):
    check_positive("optimizer", self, ("learning_rate",))
    check_choice("config.optimizer.schedule", self.schedule,
                 ("inverse_sqrt", "cosine", "linear", "constant"))
    if not 0.0 <= self.ema_decay < 1.0:
      raise ConfigError(f"config.optimizer.ema_decay={self.ema_decay} must be in [0, 1) "
                        "(0: no moving average)")
    if not 0.0 <= self.cooldown_fraction <= 1.0:
      raise ConfigError(f"config.optimizer.cooldown_fraction={self.cooldown_fraction} must be "
                        "in [0, 1] (0: no cooldown)")
    if self.warmup_steps < 0:
      raise ConfigError(f"config.optimizer.warmup_steps={self.warmup_steps} must be >= 0")
    if not all(isinstance(p, str) and p for p in self.weight_decay_exclude):
      raise ConfigError(f"config.optimizer.weight_decay_exclude={self.weight_decay_exclude!r} "
                        "must be a tuple of glob patterns (e.g. ('*bias', '*scale'))")


def _beam_search(decode) -> bool:
  return not (decode.greedy or decode.sampling)


# CTranslate2's `translate_batch` keywords of the options that are a function of the section
# (see fields.Option; each docstring is the reference page's entry).
def _ct2_beam_size(d):
  """`beam_size` in beam search"""
  return {"beam_size": d.beam_size} if _beam_search(d) else {}


def _ct2_length_penalty(d):
  """`length_penalty` in beam search (CTranslate2's formula), else 0 (scores: total
  log-probabilities, as ours)"""
  return {"length_penalty": d.length_penalty if _beam_search(d) else 0.0}


def _ct2_length_penalty_note(d) -> str:
  if not (_beam_search(d) and d.length_penalty):
    return ""
  return (f"length_penalty={d.length_penalty}: CTranslate2 divides a hypothesis' "
          f"log-probability by length ** {d.length_penalty}, ours by ((5 + length) / 6) ** "
          f"{d.length_penalty} (GNMT), and its beam stops once beam_size hypotheses have "
          "finished")


def _ct2_max_length(d):
  """`max_decoding_length`, at most (each sentence's own cap: max_length_a's row)"""
  return {"max_decoding_length": d.max_length}


def _ct2_caps_note(d) -> str:
  if not (d.max_length_a or d.max_length_b < d.max_length):
    return ""
  return (f"max_length_a={d.max_length_a}, max_length_b={d.max_length_b}: translate_batch caps "
          "a translation at max_decoding_length only, not at a * source_length + b (the "
          "engine gives each group of sentences of one cap a call of its own)")


_CAPS = ByEngine("each group of sentences of one cap (min(max_length, a * source length + b), "
                 "ours) translated with that `max_decoding_length`")


def _ct2_greedy(d):
  """`beam_size=1`, `sampling_topk=1`"""
  return {"beam_size": 1, "sampling_topk": 1} if d.greedy else {}


def _ct2_sampling(d):
  """`beam_size=1`"""
  return {"beam_size": 1} if d.sampling else {}


def _ct2_temperature(d):
  """`sampling_temperature` (sampling)"""
  return {"sampling_temperature": d.temperature} if d.sampling else {}


def _ct2_top_k(d):
  """`sampling_topk` (sampling; 0 = all, as ours)"""
  return {"sampling_topk": d.top_k} if d.sampling else {}


def _ct2_top_p(d):
  """`sampling_topp` (sampling)"""
  return {"sampling_topp": d.top_p} if d.sampling else {}


def _ct2_nbest(d):
  """`num_hypotheses` (without MBR)"""
  return {} if d.mbr else {"num_hypotheses": d.nbest}


def _ct2_mbr_candidates(d):
  """`num_hypotheses` (with MBR)"""
  return {"num_hypotheses": d.mbr_candidates} if d.mbr else {}


def _ct2_mbr_note(d) -> str:
  if not d.mbr:
    return ""
  return (f"mbr={d.mbr!r}: translate_batch has no minimum-Bayes-risk choice (the engine asks "
          "num_hypotheses=mbr_candidates and orders them by decoding.mbr.mbr_order)")


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
  """How translations are searched for (`config.decode`), in training and in the tools."""
  # 1 with greedy=False is beam search of width 1 (== greedy)
  beam_size: int = option(minimum=1, request="beam_size", compiles="shape",
                          ctranslate2=_ct2_beam_size)
  # GNMT alpha; 0 ranks by total log-probability
  length_penalty: float = option(minimum=0, request="length_penalty", compiles="static",
                                 ctranslate2=_ct2_length_penalty,
                                 ctranslate2_note=_ct2_length_penalty_note)
  # most target tokens generated (EOS included)
  max_length: int = option(minimum=1, ctranslate2=_ct2_max_length)
  # a of the per-sentence limit a * source_length + b tokens
  max_length_a: float = option(ctranslate2=_CAPS, ctranslate2_note=_ct2_caps_note)
  # b of that limit
  max_length_b: int = option(ctranslate2=_CAPS)
  # sentences decoded together
  batch_size: int = option(minimum=1, compiles="shape", ctranslate2="max_batch_size")
  num_samples_to_log: int       # sample translations printed at each evaluation
  # argmax decoding, no beam
  greedy: bool = option(compiles="shape", ctranslate2=_ct2_greedy)
  # ancestral sampling instead of beam search
  sampling: bool = option(request="sampling", compiles="shape", ctranslate2=_ct2_sampling)
  # sampling: logits / temperature
  temperature: float = option(above=0, request="temperature", compiles="static",
                              ctranslate2=_ct2_temperature)
  # sampling: keep the k most likely tokens (0 = all)
  top_k: int = option(minimum=0, request="top_k", compiles="static", ctranslate2=_ct2_top_k)
  # sampling: keep the smallest set with probability >= p
  top_p: float = option(above=0, maximum=1, request="top_p", compiles="static",
                        ctranslate2=_ct2_top_p)
  # sampling: random seed (same seed, same samples)
  seed: int = option(ctranslate2=ByEngine(
      "`ctranslate2.set_random_seed` before sampling (once per process: a seed per call is "
      "refused)"))
  # beam search: hypotheses returned per sentence (<= beam_size)
  nbest: int = option(minimum=1, request="nbest", compiles="static", ctranslate2=_ct2_nbest)
  # beam search: fewest tokens before EOS may end a hypothesis
  min_length: int = option(minimum=0, compiles="static", ctranslate2="min_decoding_length")
  # beam search's self-attention caches: "gather" (a cache per hypothesis, reordered to its parent's
  # every step), "flat" (a sentence's hypotheses share one append-only cache, each reading its
  # ancestors' slots through a mask) or "auto" (flat: faster on a CPU and a GPU measured); same
  # outputs
  beam_impl: str = option(before="auto", choices=("auto", "gather", "flat"), compiles="shape",
                          ctranslate2=ByEngine("nothing to do: no output depends on it"))
  # minimum-Bayes-risk choice among candidates by a sacreBLEU utility: "chrf" or "bleu" (sentence
  # level); "" = off
  mbr: str = option(before="", choices=("", "chrf", "bleu"), compiles="static",
                    ctranslate2=ByEngine("its `num_hypotheses` candidates ordered by "
                                         "`decoding.mbr.mbr_order`, as ours"),
                    ctranslate2_note=_ct2_mbr_note)
  # mbr: candidates per sentence: the beam's n-best (<= beam_size) or, with sampling, that many
  # samples
  mbr_candidates: int = option(before=4, compiles="shape", ctranslate2=_ct2_mbr_candidates)
  # no n-gram of this many tokens twice in a translation (its forced prefix included): a token
  # that would repeat one is never chosen; 0 = off
  no_repeat_ngram_size: int = option(before=0, minimum=0, request="no_repeat_ngram_size",
                                     ctranslate2="no_repeat_ngram_size", compiles="static")
  # > 1: each token already in the translation has its logit divided by this (a negative
  # one multiplied) before the softmax (Keskar et al., 2019); 1 = off
  repetition_penalty: float = option(before=1.0, above=0, request="repetition_penalty",
                                     ctranslate2="repetition_penalty", compiles="static")

  def __post_init__(self):
    check_ranges("config.decode", self)
    check_choices("config.decode", self)
    if self.greedy and self.sampling:
      raise ConfigError("config.decode.greedy and config.decode.sampling are exclusive")
    if self.nbest > self.beam_size:
      raise ConfigError(f"config.decode.nbest={self.nbest} must be in [1, beam_size="
                        f"{self.beam_size}]")
    if self.nbest > 1 and (self.greedy or self.sampling):
      raise ConfigError("config.decode.nbest > 1 needs beam search (greedy/sampling are off)")
    if self.mbr and (self.greedy or not 2 <= self.mbr_candidates <= (
        10**6 if self.sampling else self.beam_size)):
      raise ConfigError(f"config.decode.mbr={self.mbr!r} needs 2 or more mbr_candidates (got "
                        f"{self.mbr_candidates}): the beam's n-best (<= beam_size="
                        f"{self.beam_size}) or samples (sampling=True); not greedy decoding")
    # A setting the mode would leave unused is a mistake, not a no-op (beam_size,
    # length_penalty, seed and beam_impl, in every config and read by their mode only, aside:
    # a request for sampling from a run set to flat beam search is not refused).
    unused = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if not self.sampling else {}
    unused.update({"min_length": 0} if self.greedy or self.sampling else {})
    for key, off in unused.items():
      if getattr(self, key) != off:
        mode = "sampling" if self.sampling else "greedy decoding" if self.greedy else "beam search"
        raise ConfigError(f"config.decode.{key}={getattr(self, key)} has no effect in {mode}; "
                          f"leave it at {off} or choose the mode that uses it")

  def length_limit(self, source_length: int) -> int:
    """The most tokens (EOS included) of the translation of a `source_length`-token source."""
    return max(1, min(self.max_length,
                      int(self.max_length_a * source_length + self.max_length_b)))


@dataclasses.dataclass(frozen=True)
class ParallelismConfig:
  """The device mesh and how parameters are split over it (`config.parallelism`)."""
  mesh_shape: tuple[int, ...]   # (data, fsdp, tensor); one -1 takes the devices left
  # (logical parameter axis, mesh axis or None = replicated): which mesh axis splits each
  # parameter axis; with the shipped rules the mesh shape picks it (docs/guides/accelerators.md)
  axis_rules: tuple[tuple[str, str | None], ...]

  def __post_init__(self):
    object.__setattr__(self, "mesh_shape", tuple(self.mesh_shape))
    object.__setattr__(self, "axis_rules", tuple(tuple(r) for r in self.axis_rules))
    if len(self.mesh_shape) != len(MESH_AXES):
      raise ConfigError(f"config.parallelism.mesh_shape={self.mesh_shape} needs "
                        f"{len(MESH_AXES)} entries {MESH_AXES}")
    if list(self.mesh_shape).count(-1) > 1:
      raise ConfigError(f"config.parallelism.mesh_shape={self.mesh_shape}: at most one -1")
    for name, axis in self.axis_rules:
      if axis is not None and axis not in MESH_AXES:
        raise ConfigError(f"config.parallelism.axis_rules maps {name!r} to unknown mesh axis "
                          f"{axis!r}; expected one of {MESH_AXES} or None")


@dataclasses.dataclass(frozen=True)
class InitFromConfig:
  """Fine-tuning (`config.init_from`): a new run starts from another run's weights, with a
  fresh optimizer and step 0 and the other run's tokenizer; "" = from random weights."""
  # the run to start from
  workdir: str = declared(before="")
  # which of its weights: "best", "latest", a step, "average:N", "steps:A,B", each with ":ema" /
  # ":raw" (default: its moving average where it keeps one), as `evaluate --checkpoint` takes
  checkpoint: str = declared(before="best")

  def __post_init__(self):
    if self.workdir and not self.checkpoint:
      raise ConfigError("config.init_from.checkpoint is '': name the checkpoint to start "
                        "from (e.g. 'best', 'latest', a step)")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """A whole run: the sections above and the run-level keys (`config.<key>`)."""
  model: ModelConfig
  data: DataConfig
  optimizer: OptimizerConfig
  decode: DecodeConfig
  parallelism: ParallelismConfig
  init_from: InitFromConfig
  seed: int                     # parameters, dropout and (data_seed -1) the data
  # the training batches' order and the tokenizer's sample; -1 = seed (a population's members share
  # the run's)
  data_seed: int = declared(before=-1)
  num_train_steps: int          # optimizer updates of the whole run
  log_every_steps: int          # train metrics and the progress line
  eval_every_steps: int         # validation loss + BLEU (and at the last step)
  checkpoint_every_steps: int   # checkpoints (and one at the last step)
  # also validate when this much wall clock has passed since the last validation (checked at logging
  # steps); 0 = off
  eval_every_minutes: float = declared(before=0.0)
  # also save after this much wall clock; 0 = off
  checkpoint_every_minutes: float = declared(before=0.0)
  max_checkpoints_to_keep: int  # the newest ones; the best by BLEU is kept apart
  label_smoothing: float        # probability mass spread over the vocabulary in the loss
  eval_max_sentences: int       # validation sentences decoded for BLEU; 0 = all
  early_stopping_patience: int  # stop after this many evals without a better BLEU; 0 = off
  num_micro_batches: int        # gradient accumulation: the batch in this many pieces
  nonfinite_updates: str        # a NaN/Inf loss or gradient: "stop" the run, or "skip" it
  # wall clock of the training loop (steps, validation, saves), summed over resumed runs, after
  # which training ends as at its last step (saved, validated, tested); 0 = no limit
  time_budget_minutes: float = declared(before=0.0)
  population: PopulationConfig  # K members trained as one program (config.population)

  @property
  def batch_seed(self) -> int:
    """The seed of the training data's order and of the tokenizer's sample."""
    return self.seed if self.data_seed < 0 else self.data_seed

  def __post_init__(self):
    for name in ("num_train_steps", "log_every_steps", "eval_every_steps",
                 "checkpoint_every_steps", "max_checkpoints_to_keep", "num_micro_batches"):
      if getattr(self, name) < 1:
        raise ConfigError(f"config.{name}={getattr(self, name)} must be >= 1")
    for name in ("eval_every_minutes", "checkpoint_every_minutes"):
      if getattr(self, name) < 0:
        raise ConfigError(f"config.{name}={getattr(self, name)} must be >= 0 (0: off)")
    if self.time_budget_minutes < 0:
      raise ConfigError(f"config.time_budget_minutes={self.time_budget_minutes} must be >= 0 "
                        "(0: no limit)")
    if self.nonfinite_updates not in ("stop", "skip"):
      raise ConfigError(f"config.nonfinite_updates={self.nonfinite_updates!r} must be 'stop' "
                        "or 'skip'")
    if not 0.0 <= self.label_smoothing < 1.0:
      raise ConfigError(f"config.label_smoothing={self.label_smoothing} must be in [0, 1)")
    if self.data.batch_size % self.num_micro_batches:
      raise ConfigError(f"config.data.batch_size={self.data.batch_size} is not divisible by "
                        f"config.num_micro_batches={self.num_micro_batches}")
    if self.model.max_len < max(self.data.max_source_length, self.data.max_target_length):
      raise ConfigError(
          f"config.model.max_len={self.model.max_len} is shorter than the data's length limit "
          f"(max_source_length={self.data.max_source_length}, "
          f"max_target_length={self.data.max_target_length})")
    if self.decode.max_length > self.model.max_len:
      raise ConfigError(f"config.decode.max_length={self.decode.max_length} exceeds "
                        f"config.model.max_len={self.model.max_len}")


SECTIONS = {"model": ModelConfig, "data": DataConfig, "optimizer": OptimizerConfig,
            "decode": DecodeConfig, "parallelism": ParallelismConfig,
            "init_from": InitFromConfig, "population": PopulationConfig}
