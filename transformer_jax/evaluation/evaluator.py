"""Scoring a model on an evaluation set: its loss (teacher-forced NLL per real token) and the
BLEU and chrF of its translations. Training's validation and the evaluate tool both use it."""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax

from transformer_jax.config.sections import DecodeConfig
from transformer_jax.data.eval_sets import EvalSet
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.decoding.batches import Hypothesis
from transformer_jax.decoding.engine import SearchEngine
from transformer_jax.decoding.ensemble import prepare
from transformer_jax.evaluation.scoring import Score, score
from transformer_jax.model.transformer import Transformer, apply_to_batch
from transformer_jax.ops.losses import cross_entropy
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.reporting.metrics import sum_metrics


def eval_step(params, batch, *, model):
  """Summed NLL and token count of a padded batch (no dropout, no smoothing)."""
  logits = apply_to_batch(model, params, batch, train=False)
  _, nll_sum, num_tokens = cross_entropy(logits, batch["targets"], batch["targets"] > 0, 0.0)
  return {"nll_sum": nll_sum, "num_tokens": num_tokens}


class ValidationCancelled(Exception):
  """An evaluation stopped between two batches because `Evaluator.cancelled()` said so."""


@dataclasses.dataclass
class Evaluator:
  """Validation loss, and BLEU of translations, on one evaluation set. `cancelled`, when
  given, is asked between batches; True stops the evaluation (ValidationCancelled)."""
  eval_set: EvalSet
  model: Transformer
  tokenizer: Tokenizer
  decode: DecodeConfig
  mesh: object
  cancelled: Callable[[], bool] | None = None

  def __post_init__(self):
    self._eval_step = jax.jit(functools.partial(eval_step, model=self.model))

  def _check(self, *_):
    if self.cancelled is not None and self.cancelled():
      raise ValidationCancelled()

  def loss(self, params) -> float:
    total = None
    batch_size = mesh_lib.round_up_to_data_parallel(self.decode.batch_size, self.mesh)
    for _, batch in self.eval_set.batches(batch_size, self.model.config.max_len):
      self._check()
      batch = {k: mesh_lib.global_array_from_full(v, self.mesh) for k, v in batch.items()}
      total = sum_metrics(total, self._eval_step(params, batch))
    total = jax.device_get(total)
    return float(total["nll_sum"] / max(total["num_tokens"], 1.0))

  def translations(self, params, on_batch=None) -> list[Hypothesis]:
    """The best translation of every source, in order (`on_batch(n)`: after each batch of n
    sentences, e.g. a progress bar's update)."""
    def done(n):
      self._check()
      if on_batch is not None:
        on_batch(n)

    self._check()
    engine = SearchEngine(prepare(self.model, params), self.tokenizer, self.decode, self.mesh)
    return engine.translate_best(self.eval_set, on_batch=done)

  def bleu(self, params) -> tuple[Score, list[str]]:
    """The score of the translations of every source, and the translations, in order."""
    hyps = [h.text for h in self.translations(params)]
    return score(hyps, self.eval_set.references), hyps


def sample_translations(eval_set: EvalSet, hyps: list[str], n: int) -> str:
  """The first `n` sources with their references and translations, as text."""
  return "\n".join(f"  SRC: {eval_set.sources[i]}\n  REF: {eval_set.references[i]}\n"
                   f"  HYP: {hyps[i]}" for i in range(min(n, len(hyps))))
