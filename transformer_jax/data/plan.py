"""The data a run reads, resolved once from `config.data`: its training corpora by name, with
where each lives, and its evaluation and test sets by the names their metrics carry.

A run trains on config.data's own corpus alone (a plan of one, named "") or on the named corpora
of a mixture (`config.data.corpora`); everything that reads data (the training pipeline,
tokenizer training, preparation, evaluation sets) takes the plan instead of working out the
corpora from the config again.
"""

from __future__ import annotations

import dataclasses

from transformer_jax.config.corpora import CorpusConfig
from transformer_jax.config.sections import DataConfig
from transformer_jax.data import corpus
from transformer_jax.data.tokenizer import Tokenizer


@dataclasses.dataclass(frozen=True)
class TrainingCorpus:
  """A corpus trained on: where its training split lives (`train.train_split`), its share of
  the pairs drawn and the tag before each of its sources."""
  name: str                # config.data.corpora's NAME; "" for config.data's own corpus
  train: corpus.CorpusSpec
  weight: float = 1.0
  tag: str = ""

  @property
  def split(self) -> str:
    return self.train.train_split

  @property
  def where(self) -> str:
    """The corpus as error messages name it."""
    if self.name:
      return self.train.data_dir or self.train.dataset
    return self.train.dataset

  @property
  def label(self) -> str:
    """Its training split as preparation reports it."""
    if self.name:
      return f"corpus {self.name} ({self.split})"
    return f"{self.train.dataset}:{self.split}"

  def source_prefix(self, tokenizer: Tokenizer) -> list[int]:
    """The ids put before every source of this corpus: its tag's, or none."""
    if not self.tag:
      return []
    return [tokenizer.tag_id(self.tag, f"config.data.corpora.{self.name}.tag")]


@dataclasses.dataclass(frozen=True)
class EvalSplit:
  """A split evaluated (validation or test), by the name its metrics carry: "" for
  config.data.eval_split, config.data.test_split's own name, `NAME.SPLIT` for a corpus's."""
  name: str
  split: str
  spec: corpus.CorpusSpec  # (serving `split`)
  where: str               # the corpus as the log and errors name it
  corpus: TrainingCorpus | None = None  # a mixture corpus's split: its tag before each source


@dataclasses.dataclass(frozen=True)
class DataPlan:
  """The training corpora (in config order), the evaluation and test splits, and every corpus
  that preparation makes ready; `cfg` for what is not about corpora (lengths, batch size,
  threads)."""
  cfg: DataConfig = dataclasses.field(repr=False)
  corpora: tuple[TrainingCorpus, ...]
  eval_splits: tuple[EvalSplit, ...]
  test_splits: tuple[EvalSplit, ...]
  prepared: tuple[corpus.CorpusSpec, ...]

  @property
  def mixed(self) -> bool:
    """A mixture (config.data.corpora): its corpora drawn by weight, counted per corpus."""
    return bool(self.cfg.corpora)

  @property
  def tags(self) -> list[str]:
    """The distinct tags, in config order (the tokenizer reserves a piece for each)."""
    return list(dict.fromkeys(c.tag for c in self.corpora if c.tag))

  def corpus_split(self, name: str) -> EvalSplit | None:
    """The split `NAME.SPLIT` (a mixture corpus's eval or test split), if the plan has it."""
    return next((s for s in self.eval_splits + self.test_splits
                 if s.corpus is not None and s.name == name), None)


def data_plan(cfg: DataConfig) -> DataPlan:
  """The plan of `cfg`: its corpora's specs worked out here, once."""
  mixture = tuple(_mixture_corpus(name, entry, cfg) for name, entry in cfg.corpora.items())
  own = TrainingCorpus("", corpus.corpus_spec(cfg))
  evals = (own_split("", cfg, cfg.eval_split, cfg.eval_dataset),) \
      if cfg.eval_split or not cfg.corpora else ()
  tests = (own_split(cfg.test_split, cfg, cfg.test_split, cfg.test_dataset),) \
      if cfg.test_split else ()
  return DataPlan(
      cfg, mixture or (own,),
      evals + _corpus_splits(mixture, cfg, "eval_split"),
      tests + _corpus_splits(mixture, cfg, "test_split"),
      _prepared(cfg))


def own_split(name: str, cfg: DataConfig, split: str, dataset: str = "") -> EvalSplit:
  """A split of config.data's corpus (of `dataset`, default config.data.dataset), named
  `name`; a split the config does not name is prepared on its own."""
  spec = corpus.corpus_spec(cfg, dataset)
  if split not in spec.splits:
    spec = dataclasses.replace(spec, splits=(split,))
  return EvalSplit(name, split, spec, dataset or cfg.dataset)


def _spec_of(entry: CorpusConfig, cfg: DataConfig, splits: tuple[str, ...]
             ) -> corpus.CorpusSpec:
  return corpus.CorpusSpec(entry.dataset, entry.data_dir, entry.source_lang, entry.target_lang,
                           splits, cfg.cache_dir or corpus.default_cache_dir(), cfg.cleaning,
                           entry.split)


def _mixture_corpus(name: str, entry: CorpusConfig, cfg: DataConfig) -> TrainingCorpus:
  return TrainingCorpus(name, _spec_of(entry, cfg, (entry.split,)), entry.weight, entry.tag)


def _corpus_splits(mixture: tuple[TrainingCorpus, ...], cfg: DataConfig, kind: str
                   ) -> tuple[EvalSplit, ...]:
  """Each mixture corpus's `kind` split ("eval_split" or "test_split") that it names, each
  prepared on its own."""
  out = []
  for c in mixture:
    split = getattr(cfg.corpora[c.name], kind)
    if split:
      spec = dataclasses.replace(c.train, splits=(split,))
      out.append(EvalSplit(f"{c.name}.{split}", split, spec, str(spec.local_folder), c))
  return tuple(out)


def _prepared(cfg: DataConfig) -> tuple[corpus.CorpusSpec, ...]:
  """Every corpus the config reads, each with all the splits it serves (none left empty)."""
  specs = [corpus.corpus_spec(cfg, dataset) for dataset in dict.fromkeys(
      [cfg.dataset, cfg.eval_dataset or cfg.dataset, cfg.test_dataset or cfg.dataset])]
  specs += [_spec_of(entry, cfg, tuple(dict.fromkeys(
      filter(None, (entry.split, entry.eval_split, entry.test_split)))))
      for entry in cfg.corpora.values()]
  return tuple(spec for spec in specs if spec.splits)
