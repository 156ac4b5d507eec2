"""What the training loop logs for the steps since the last log: loss, gradient norm, learning
rate, speed, and the data's counts (filtered pairs, epochs, a mixture's per-corpus shares)."""

from __future__ import annotations

import jax


def train_metrics(acc, elapsed: float, real_tokens: int, learning_rate: float, skipped: int,
                  pipeline) -> dict[str, float]:
  """What is logged for the steps summed in `acc` (which took `elapsed` seconds)."""
  n = max(acc["num_tokens"], 1.0)
  data_filter = pipeline.filter
  epochs = {} if pipeline.epochs is None else {"data/epochs": pipeline.epochs,
                                               "data/pairs_kept": data_filter.kept}
  return {**epochs, **corpus_metrics(pipeline),
          "train/loss": acc["loss_sum"] / n, "train/nll": acc["nll_sum"] / n,
          "train/grad_norm": acc["grad_norm"] / max(acc["steps"] - acc["nonfinite_steps"], 1.0),
          "train/learning_rate": learning_rate,
          "train/skipped_steps": skipped,
          "perf/tokens_per_sec": real_tokens * jax.process_count() / elapsed,
          "perf/steps_per_sec": acc["steps"] / elapsed,
          "data/filtered_examples": data_filter.filtered,
          "data/filtered_empty": data_filter.empty,
          "data/filtered_too_long": data_filter.too_long}


def corpus_metrics(pipeline) -> dict[str, float]:
  """A mixture's per-corpus counts: pairs drawn, tokens given, epochs, share of the pairs."""
  counts = pipeline.filter
  total = max(int(counts.corpus_pairs.sum()), 1)
  out = {}
  for i, name in enumerate(pipeline.corpus_names):
    pairs = int(counts.corpus_pairs[i])
    out.update({f"data/corpus/{name}/pairs": pairs,
                f"data/corpus/{name}/tokens": int(counts.corpus_tokens[i]),
                f"data/corpus/{name}/epochs": pairs / max(pipeline.corpus_sizes[i], 1),
                f"data/corpus/{name}/share": pairs / total})
  return out
