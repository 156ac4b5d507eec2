"""What a run needs before its first step: its datasets prepared and its tokenizer trained (or
found) and recorded in the workdir."""

from __future__ import annotations

import time
from pathlib import Path

import jax

from transformer_jax.config.sections import TrainConfig
from transformer_jax.data import corpus, plan, tokenized
from transformer_jax.data.pipeline import training_sentences
from transformer_jax.data.tokenizer import Tokenizer, load_or_train
from transformer_jax.errors import ConfigError
from transformer_jax.workdir import layout


def load_tokenizer(cfg: TrainConfig, workdir: Path, data: plan.DataPlan) -> Tokenizer:
  """The run's tokenizer (`layout.tokenizer_path`), trained on the training corpora of `data`
  (the plan of cfg.data) if absent;
  an error if it cannot hold the model's vocabulary or is not the one the run was trained
  with. Records it in the workdir's tokenizer.json."""
  path = layout.tokenizer_path(cfg, workdir)
  if jax.process_index() != 0 and not path.is_file():
    _wait_for(path)  # process 0 trains it; the others read the same file (shared workdir)
  with layout.naming_recorded_fingerprint(workdir):
    tokenizer = load_or_train(path, lambda: training_sentences(data), cfg.model.vocab_size,
                              cfg.data.tokenizer_max_sentences, cfg.batch_seed,
                              cfg.data.tokenizer_max_chars, tuple(data.tags))
  if tokenizer.vocab_size > cfg.model.vocab_size:
    raise ConfigError(f"tokenizer {path} has {tokenizer.vocab_size} pieces but "
                      f"config.model.vocab_size={cfg.model.vocab_size}")
  mismatch = layout.tokenizer_mismatch(workdir, tokenizer)
  if mismatch:
    raise ConfigError(f"{mismatch}; its checkpoints need that tokenizer")
  layout.record_tokenizer(workdir, tokenizer)
  return tokenizer


def _wait_for(path: Path, timeout_s: float = 600.0):
  start = time.time()
  while not path.is_file():
    if time.time() - start > timeout_s:
      raise TimeoutError(f"tokenizer {path} did not appear within {timeout_s:.0f}s")
    time.sleep(1.0)


def prepare(cfg: TrainConfig, workdir: str | Path, write_splits=None, write_ids=None
            ) -> tuple[dict[str, int], Tokenizer]:
  """Prepares every dataset the config reads (local ones' shards written by `write_splits`,
  e.g. an Apache Beam pipeline: `data.apache_beam_prep`), then its tokenizer, then (with
  config.data.pretokenize) the training split(s) as token ids (by `write_ids`); returns the
  pairs in each `dataset:split` (and in the tokenized splits) and the tokenizer."""
  data = plan.data_plan(cfg.data)
  sizes = {}
  for spec in data.prepared:
    builder = corpus.get_builder(spec, write_splits)
    where = spec.data_dir or spec.dataset if spec.dataset == "local" else spec.dataset
    for split in spec.splits:
      sizes[f"{where}:{split}"] = len(builder.as_data_source(split=split))
  tokenizer = load_tokenizer(cfg, Path(workdir), data)
  for planned in data.corpora if cfg.data.pretokenize else ():
    store = tokenized.tokenized_split(planned.train, tokenizer, write_ids)
    sizes[f"{planned.label} as token ids"] = store.num_pairs
  return sizes, tokenizer
