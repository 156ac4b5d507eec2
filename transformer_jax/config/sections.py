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
from transformer_jax.config.decoding import DecodeConfig
from transformer_jax.config.fields import declared
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
class PlanConfig:
  """A run planned to end within a stated time (`config.plan`), when config.num_train_steps is
  0: the steps from this machine's measured step time, the validations and the test decode
  kept within the time (training.planning)."""
  # the whole run's wall clock, from the command's start to the test's result; 0 = no plan
  minutes: float = declared(before=0.0)
  # the same where the matmuls run in f32 (config.model.dtype "auto" found no fast bf16: a slower
  # machine, given longer); 0 = `minutes`
  f32_minutes: float = declared(before=0.0)
  # timed steps on a batch of the training's shape before step 1 (after one that compiles)
  probe_steps: int = declared(before=1)
  # at most this many steps, however fast the machine (more over-fit the corpus); 0 = no limit
  max_steps: int = declared(before=0)
  # the share of the training time that validations before the last one may take
  validation_share: float = declared(before=0.0)
  # a plan of at least this many steps trains the long recipe: subword sampling (which costs BLEU
  # in short runs and gains in long ones) at `sampling_alpha`; shorter plans as
  # config.data.subword_sampling says
  sampling_from_steps: int = declared(before=0)
  # the long recipe's config.data.subword_sampling.alpha; 0 = the configured one
  sampling_alpha: float = declared(before=0.0)

  def __post_init__(self):
    for name in ("minutes", "f32_minutes", "max_steps", "sampling_from_steps",
                 "sampling_alpha"):
      if getattr(self, name) < 0:
        raise ConfigError(f"config.plan.{name}={getattr(self, name)} must be >= 0")
    if self.probe_steps < 1:
      raise ConfigError(f"config.plan.probe_steps={self.probe_steps} must be >= 1 (the "
                        "compiling call is not timed)")
    if not 0.0 <= self.validation_share < 1.0:
      raise ConfigError(f"config.plan.validation_share={self.validation_share} must be in "
                        "[0, 1)")


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
  num_train_steps: int          # optimizer updates of the whole run; 0 = planned (config.plan)
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
  plan: PlanConfig              # the steps that fit a stated time (num_train_steps 0)

  @property
  def batch_seed(self) -> int:
    """The seed of the training data's order and of the tokenizer's sample."""
    return self.seed if self.data_seed < 0 else self.data_seed

  def __post_init__(self):
    self._check_plan()
    for name in ("log_every_steps", "eval_every_steps",
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

  def _check_plan(self):
    """num_train_steps 0 (planned) needs config.plan.minutes and a schedule that the number of
    steps does not shape (the plan is made after the optimizer is built)."""
    if self.num_train_steps < 0 or (self.num_train_steps == 0 and not self.plan.minutes):
      raise ConfigError(f"config.num_train_steps={self.num_train_steps} must be >= 1, or 0 "
                        "with config.plan.minutes > 0 (steps planned to fit the time)")
    if self.num_train_steps:
      return
    if self.optimizer.schedule not in ("inverse_sqrt", "constant"):
      raise ConfigError(f"config.num_train_steps=0 (planned) needs config.optimizer.schedule "
                        f"'inverse_sqrt' or 'constant', not {self.optimizer.schedule!r} (its "
                        "decay is set by the number of steps): set config.num_train_steps")
    if self.population.size:
      raise ConfigError("config.num_train_steps=0 (planned) is not for a population "
                        "(config.population): set config.num_train_steps")

SECTIONS = {"model": ModelConfig, "data": DataConfig, "optimizer": OptimizerConfig,
            "decode": DecodeConfig, "parallelism": ParallelismConfig,
            "init_from": InitFromConfig, "population": PopulationConfig, "plan": PlanConfig}
