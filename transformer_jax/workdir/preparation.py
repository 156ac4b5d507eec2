"""What a run needs before its first step: its datasets prepared and its tokenizer trained (or
found) and recorded in the workdir."""

from __future__ import annotations

import time
from pathlib import Path

import jax

from transformer_jax.config.sections import TrainConfig
from transformer_jax.data import corpus, mixture, tokenized, tokenizer
from transformer_jax.data.pipeline import training_sentences
from transformer_jax.errors import ConfigError
from transformer_jax.workdir import layout


def load_tokenizer(cfg: TrainConfig, workdir: Path) -> tokenizer.Tokenizer:
  """The run's tokenizer (`layout.tokenizer_path`), trained on the training split if absent;
  an error if it cannot hold the model's vocabulary or is not the one the run was trained
  with. Records it in the workdir's tokenizer.json."""
  path = layout.tokenizer_path(cfg, workdir)
  if jax.process_index() != 0 and not path.is_file():
    _wait_for(path)  # process 0 trains it; the others read the same file (shared workdir)
  with layout.naming_recorded_fingerprint(workdir):
    tok = tokenizer.load_or_train(path, lambda: training_sentences(cfg.data),
                                  cfg.model.vocab_size, cfg.data.tokenizer_max_sentences,
                                  cfg.batch_seed, cfg.data.tokenizer_max_chars,
                                  tuple(mixture.tags(cfg.data)))
  if tok.vocab_size > cfg.model.vocab_size:
    raise ConfigError(f"tokenizer {path} has {tok.vocab_size} pieces but "
                      f"config.model.vocab_size={cfg.model.vocab_size}")
  mismatch = layout.tokenizer_mismatch(workdir, tok)
  if mismatch:
    raise ConfigError(f"{mismatch}; its checkpoints need that tokenizer")
  layout.record_tokenizer(workdir, tok)
  return tok


def _wait_for(path: Path, timeout_s: float = 600.0):
  start = time.time()
  while not path.is_file():
    if time.time() - start > timeout_s:
      raise TimeoutError(f"tokenizer {path} did not appear within {timeout_s:.0f}s")
    time.sleep(1.0)


def prepare(cfg: TrainConfig, workdir: str | Path, write_splits=None, write_ids=None
            ) -> tuple[dict[str, int], tokenizer.Tokenizer]:
  """Prepares every dataset the config reads (local ones' shards written by `write_splits`,
  e.g. an Apache Beam pipeline: `data.apache_beam_prep`), then its tokenizer, then (with
  config.data.pretokenize) the training split(s) as token ids (by `write_ids`); returns the
  pairs in each `dataset:split` (and in the tokenized splits) and the tokenizer."""
  d = cfg.data
  specs = [corpus.corpus_spec(d, dataset) for dataset in dict.fromkeys(
      [d.dataset, d.eval_dataset or d.dataset, d.test_dataset or d.dataset])]
  specs += [mixture.spec_of(entry, d, tuple(dict.fromkeys(
      filter(None, (entry.split, entry.eval_split, entry.test_split)))))
      for entry in d.corpora.values()]
  sizes = {}
  for spec in specs:
    if not spec.splits:
      continue
    builder = corpus.get_builder(spec, write_splits)
    where = spec.data_dir or spec.dataset if spec.dataset == "local" else spec.dataset
    for split in spec.splits:
      sizes[f"{where}:{split}"] = len(builder.as_data_source(split=split))
  tok = load_tokenizer(cfg, Path(workdir))
  if d.pretokenize and not d.corpora:
    sizes[f"{d.dataset}:{d.train_split} as token ids"] = tokenized.tokenized_split(
        d, tok, write_ids=write_ids).num_pairs
  for name, entry in d.corpora.items():
    store = tokenized.tokenized_split(d, tok, entry.split, mixture.spec_of(entry, d), write_ids)
    sizes[f"corpus {name} ({entry.split}) as token ids"] = store.num_pairs
  return sizes, tok
