"""TrainState, the pure train/eval steps, and the training loop with evaluation and resume."""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import logging
from flax.training import train_state

from transformer_jax import (checkpoints, corpus, data, decode, evaluate, fused_loss, metrics,
                             sharding, tokenizer)
from transformer_jax import faults as faults_lib
from transformer_jax.config import ConfigError, TrainConfig
from transformer_jax.model import Transformer
from transformer_jax.optimizer import learning_rate_schedule, make_optimizer

log = logging.getLogger(__name__)


class TrainState(train_state.TrainState):
  """Step, parameters and optimizer state (apply_fn and tx are static)."""


def cross_entropy(logits_BTV, targets_BT, weights_BT, label_smoothing: float):
  """Sums over real tokens of (label-smoothed loss, plain NLL), and the token count.

  The smoothed loss has its minimum (the entropy of the smoothed target) subtracted, so that
  a perfect model scores 0 whatever the smoothing.
  """
  V = logits_BTV.shape[-1]
  log_probs = jax.nn.log_softmax(logits_BTV.astype(jnp.float32))
  nll_BT = -jnp.take_along_axis(log_probs, targets_BT[..., None], axis=-1)[..., 0]
  confidence, low, entropy = fused_loss.smoothing_constants(V, label_smoothing)
  smooth_BT = confidence * nll_BT - low * (jnp.sum(log_probs, axis=-1) + nll_BT)
  loss_BT = smooth_BT - entropy
  w = weights_BT.astype(jnp.float32)
  return jnp.sum(loss_BT * w), jnp.sum(nll_BT * w), jnp.sum(w)


def _logits(model, params, batch, train, rngs=None, return_hidden=False):
  return model.apply(
      {"params": params}, batch["inputs"], batch["targets"],
      inputs_positions_BS=batch.get("inputs_positions"),
      targets_positions_BT=batch.get("targets_positions"),
      inputs_segmentation_BS=batch.get("inputs_segment_ids"),
      targets_segmentation_BT=batch.get("targets_segment_ids"),
      train=train, rngs=rngs, return_hidden=return_hidden)


def training_loss_sums(model, params, batch, rngs, label_smoothing: float):
  """(smoothed loss sum, NLL sum, token count) of a training batch. With a tied softmax the
  output layer and loss run fused, in chunks of tokens (`fused_loss`); otherwise through the
  model's logits."""
  targets_BT = batch["targets"]
  if not model.config.tie_output_embedding:
    logits = _logits(model, params, batch, True, rngs)
    return cross_entropy(logits, targets_BT, targets_BT > 0, label_smoothing)
  hidden_BTD, table_VD = _logits(model, params, batch, True, rngs, return_hidden=True)
  return fused_loss.output_loss(hidden_BTD.reshape(-1, hidden_BTD.shape[-1]), table_VD,
                                targets_BT.reshape(-1),
                                (targets_BT > 0).reshape(-1).astype(jnp.float32),
                                label_smoothing, model.config.compute_dtype)


def train_step(state: TrainState, batch, rng, *, model, label_smoothing: float,
               num_micro_batches: int = 1, nonfinite_at_step: int = 0):
  """One optimizer step; returns the new state and metric sums with their denominators.

  With `num_micro_batches` k > 1 the batch is processed as k micro-batches (gradient
  accumulation): the summed gradients over all of them, divided by the batch's token count,
  are the full batch's gradient, at 1/k of the activation memory.

  A non-finite loss or gradient is never applied: the step counter advances, parameters and
  optimizer state stay as they were, and the metrics count it (`nonfinite_steps`, and the
  step in `first_nonfinite_step`); the loop then stops or goes on (config.nonfinite_updates).
  `nonfinite_at_step` injects NaN gradients at that step (faults.Faults, for tests).
  """
  dropout_rng = jax.random.fold_in(rng, state.step)

  def loss_fn(params, batch, rngs):
    loss_sum, nll_sum, num_tokens = training_loss_sums(model, params, batch, rngs,
                                                       label_smoothing)
    return loss_sum / jnp.maximum(num_tokens, 1.0), (loss_sum, nll_sum, num_tokens)

  if num_micro_batches == 1:
    grads, (loss_sum, nll_sum, num_tokens) = jax.grad(loss_fn, has_aux=True)(
        state.params, batch, {"dropout": dropout_rng})
  else:
    grads, (loss_sum, nll_sum, num_tokens) = _accumulated_grads(
        loss_fn, state.params, batch, dropout_rng, num_micro_batches)
  step = state.step + 1
  if nonfinite_at_step:
    grads = jax.tree_util.tree_map(
        lambda g: jnp.where(step == nonfinite_at_step, jnp.nan, g), grads)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss_sum) & jnp.isfinite(grad_norm)
  updated = state.apply_gradients(grads=grads)
  new_state = jax.tree_util.tree_map(lambda new, old: jnp.where(finite, new, old),
                                     updated, state.replace(step=step))
  return new_state, {"loss_sum": jnp.where(finite, loss_sum, 0.0),
                     "nll_sum": jnp.where(finite, nll_sum, 0.0),
                     "num_tokens": jnp.where(finite, num_tokens, 0.0),
                     "grad_norm": jnp.where(finite, grad_norm, 0.0),
                     "steps": jnp.float32(1.0),
                     "nonfinite_steps": 1.0 - finite.astype(jnp.float32),
                     "first_nonfinite_step": jnp.where(finite, jnp.inf, step.astype(jnp.float32))}


def _accumulated_grads(loss_fn, params, batch, dropout_rng, k: int):
  """Gradients of the token-mean loss over the whole batch, summed over k micro-batches."""
  def sum_loss_fn(params, micro, rngs):  # the summed (not averaged) loss of a micro-batch
    _, sums = loss_fn(params, micro, rngs)
    return sums[0], sums

  def body(acc, xs):
    index, micro = xs
    rngs = {"dropout": jax.random.fold_in(dropout_rng, index)}
    grads, sums = jax.grad(sum_loss_fn, has_aux=True)(params, micro, rngs)
    return jax.tree_util.tree_map(jnp.add, acc, (grads, sums)), None

  zeros = (jax.tree_util.tree_map(jnp.zeros_like, params), (jnp.float32(0),) * 3)
  micro_batches = jax.tree_util.tree_map(lambda x: sharding.split_interleaved(x, k), batch)
  (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(k), micro_batches))
  grads = jax.tree_util.tree_map(lambda g: g / jnp.maximum(sums[2], 1.0), grads)
  return grads, sums


def eval_step(params, batch, *, model):
  """Summed NLL and token count of a padded batch (no dropout, no smoothing)."""
  logits = _logits(model, params, batch, False)
  _, nll_sum, num_tokens = cross_entropy(logits, batch["targets"], batch["targets"] > 0, 0.0)
  return {"nll_sum": nll_sum, "num_tokens": num_tokens}


def _state_init(cfg: TrainConfig, model: Transformer, mesh):
  tx = make_optimizer(cfg.optimizer)
  dummy = jnp.ones((1, 8), jnp.int32)

  def init(rng):
    variables = model.init(rng, dummy, dummy)
    return TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx)

  boxed = jax.eval_shape(init, jax.random.PRNGKey(0))
  state_sharding = sharding.logical_to_mesh(boxed, mesh, cfg.parallelism.axis_rules)
  problems = sharding.indivisible(nn.meta.unbox(boxed), state_sharding)
  if problems:
    raise ConfigError(f"config.parallelism: mesh {dict(mesh.shape)} and its axis rules cannot "
                      "split the model's parameters evenly: " + "; ".join(problems)
                      + ". Change config.parallelism.mesh_shape, the axis rules or the sizes.")
  return init, state_sharding


def create_state(cfg: TrainConfig, model: Transformer, mesh, rng):
  """Initialised TrainState, laid out on the mesh by the logical-axis rules, and its
  shardings."""
  init, state_sharding = _state_init(cfg, model, mesh)
  return _initialise(init, state_sharding, rng), state_sharding


def _initialise(init, state_sharding, rng):
  return jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=state_sharding)(rng)


def abstract_state(cfg: TrainConfig, model: Transformer, mesh):
  """Shapes, dtypes and shardings of the TrainState, without computing it (restore target)."""
  init, state_sharding = _state_init(cfg, model, mesh)
  shapes = jax.eval_shape(lambda r: nn.meta.unbox(init(r)), jax.random.PRNGKey(0))
  return jax.tree_util.tree_map(
      lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh), shapes, state_sharding)


def count_params(params) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree_util.tree_leaves(params)))


def _sum_metrics(acc, new):
  """Adds up metric sums over steps (`first_*` entries keep the smallest)."""
  if acc is None:
    return new
  return {k: (jnp.minimum if k.startswith("first_") else jnp.add)(acc[k], new[k]) for k in acc}


@dataclasses.dataclass
class Evaluator:
  """Validation loss, and BLEU of beam-search translations, on one split."""
  name: str
  eval_set: data.EvalSet
  model: Transformer
  cfg: TrainConfig
  mesh: object
  tok: tokenizer.Tokenizer

  def __post_init__(self):
    self._eval_step = jax.jit(functools.partial(eval_step, model=self.model))

  def loss(self, params) -> float:
    total = None
    batch_size = sharding.round_up_to_data_parallel(self.cfg.decode.batch_size, self.mesh)
    for _, batch in self.eval_set.batches(batch_size, self.cfg.model.max_len):
      batch = {k: sharding.global_array_from_full(v, self.mesh) for k, v in batch.items()}
      total = _sum_metrics(total, self._eval_step(params, batch))
    total = jax.device_get(total)
    return float(total["nll_sum"] / max(total["num_tokens"], 1.0))

  def bleu(self, params) -> tuple[evaluate.Score, list[str]]:
    hyps = decode.translate(self.model, params, self.eval_set, self.tok, self.cfg.decode,
                            self.mesh)
    return evaluate.score(hyps, self.eval_set.references), hyps


def _log_samples(eval_set: data.EvalSet, hyps: list[str], n: int, label: str) -> str:
  lines = []
  for i in range(min(n, len(hyps))):
    lines.append(f"  SRC: {eval_set.sources[i]}\n  REF: {eval_set.references[i]}\n"
                 f"  HYP: {hyps[i]}")
  text = "\n".join(lines)
  if text:
    log.info("%s sample translations:\n%s", label, text)
  return text


def _write_lines(path: Path, lines: list[str]):
  if jax.process_index() == 0:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def load_tokenizer(cfg: TrainConfig, workdir: Path) -> tokenizer.Tokenizer:
  """The run's tokenizer: the configured path, or <workdir>/spm.model, trained if absent."""
  path = Path(cfg.data.tokenizer_path) if cfg.data.tokenizer_path else workdir / "spm.model"
  if jax.process_index() != 0 and not path.is_file():
    _wait_for(path)  # process 0 trains it; the others read the same file (shared workdir)
  try:
    tok = tokenizer.load_or_train(path, lambda: data.training_sentences(cfg.data),
                                  cfg.model.vocab_size, cfg.data.tokenizer_max_sentences,
                                  cfg.seed, cfg.data.tokenizer_max_chars)
  except corpus.DataError:
    raise
  except ValueError as e:  # (a vocabulary the corpus cannot fit, a tokenizer of other ids)
    raise ConfigError(str(e)) from None
  if tok.vocab_size > cfg.model.vocab_size:
    raise ConfigError(f"tokenizer {path} has {tok.vocab_size} pieces but "
                      f"config.model.vocab_size={cfg.model.vocab_size}")
  mismatch = tokenizer_mismatch(workdir, tok)
  if mismatch:
    raise ConfigError(f"{mismatch}; its checkpoints need that tokenizer")
  if not (workdir / TOKENIZER_RECORD).is_file() and jax.process_index() == 0:
    (workdir / TOKENIZER_RECORD).write_text(json.dumps(
        {"path": str(path), "fingerprint": tok.fingerprint, "vocab_size": tok.vocab_size}))
  return tok


TOKENIZER_RECORD = "tokenizer.json"


def tokenizer_mismatch(workdir: Path, tok: tokenizer.Tokenizer) -> str | None:
  """What is wrong when `tok` is not the tokenizer the run in `workdir` was trained with (as
  recorded in its tokenizer.json); None when it is, or when nothing is recorded."""
  record = Path(workdir) / TOKENIZER_RECORD
  if not record.is_file():
    return None
  recorded = json.loads(record.read_text())
  if recorded["fingerprint"] == tok.fingerprint:
    return None
  return (f"tokenizer {tok.path} is not the one {workdir} was trained with ({recorded['path']}, "
          f"fingerprint {recorded['fingerprint']}, recorded in {record}; this file's is "
          f"{tok.fingerprint})")


def _wait_for(path: Path, timeout_s: float = 600.0):
  start = time.time()
  while not path.is_file():
    if time.time() - start > timeout_s:
      raise TimeoutError(f"tokenizer {path} did not appear within {timeout_s:.0f}s")
    time.sleep(1.0)


def save_config(config_dict: dict, workdir: Path):
  if jax.process_index() == 0:
    (workdir / "config.json").write_text(json.dumps(config_dict, indent=2, sort_keys=True))


def train_and_evaluate(cfg: TrainConfig, workdir: str | Path, config_dict: dict | None = None
                       ) -> dict[str, float]:
  """Trains (resuming from the latest checkpoint in `workdir`), evaluates, and returns the
  final metrics (including `test/bleu` when a test split is configured)."""
  workdir = Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  try:
    mesh = sharding.make_mesh(cfg.parallelism)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  dp = sharding.data_parallel_size(mesh)
  if cfg.data.batch_size % (dp * cfg.num_micro_batches):
    raise ConfigError(f"config.data.batch_size={cfg.data.batch_size} is not divisible by the "
                      f"data-parallel size {dp} (mesh {dict(mesh.shape)}) times "
                      f"config.num_micro_batches={cfg.num_micro_batches}")
  model = Transformer(cfg.model)
  init, state_sharding = _state_init(cfg, model, mesh)  # fails fast on an uneven split
  tok = load_tokenizer(cfg, workdir)
  rng = jax.random.PRNGKey(cfg.seed)
  init_rng, dropout_rng = jax.random.split(rng)

  pipeline = data.train_pipeline(cfg.data, tok, cfg.seed, jax.process_index(),
                                 jax.process_count())
  train_iter = iter(pipeline.dataset)
  state = _initialise(init, state_sharding, init_rng)
  log.info("Model: %s parameters; mesh %s", f"{count_params(state.params):,}",
               dict(mesh.shape))
  ckpt = checkpoints.Checkpointer(workdir / "checkpoints", cfg.max_checkpoints_to_keep)
  # The best checkpoint by validation BLEU, kept apart from the newest ones.
  best_ckpt = checkpoints.Checkpointer(workdir / BEST_CHECKPOINTS, 1, best_metric="bleu")
  start_step, restored = ckpt.restore_latest(checkpoints.abstract_like(state), train_iter)
  if restored is not None:
    state = restored
    log.info("Resuming from step %d", start_step)
  if config_dict is not None:  # (only now: a config its checkpoints reject is not recorded)
    save_config(config_dict, workdir)
  faults = faults_lib.Faults.from_env()
  preemption = faults_lib.Preemption(ckpt.manager)

  batch_sharding = sharding.batch_sharding(mesh)
  p_train_step = jax.jit(
      functools.partial(train_step, model=model, label_smoothing=cfg.label_smoothing,
                        num_micro_batches=cfg.num_micro_batches,
                        nonfinite_at_step=faults.nonfinite_at),
      in_shardings=(state_sharding, batch_sharding, sharding.replicated(mesh)),
      out_shardings=(state_sharding, sharding.replicated(mesh)),
      donate_argnums=(0,))
  lr_fn = learning_rate_schedule(cfg.optimizer)
  writer = metrics.MetricWriter(workdir)
  evaluator = Evaluator("eval", data.load_eval_set(cfg.data, cfg.data.eval_split, tok,
                                                   cfg.eval_max_sentences,
                                                   cfg.data.eval_dataset),
                        model, cfg, mesh, tok)
  progress = metrics.Progress(cfg.num_train_steps, start_step)
  acc, real_tokens, t_last = None, 0, time.time()
  nonfinite = NonFiniteGuard(cfg.nonfinite_updates)
  skipped, preempted = 0, False
  final: dict[str, float] = {}
  stopper = EarlyStopping(cfg.early_stopping_patience, _logged_bleus(workdir, start_step))

  for step in range(start_step + 1, cfg.num_train_steps + 1):
    host_batch = next(train_iter)
    real_tokens += int((host_batch["inputs"] > 0).sum() + (host_batch["targets"] > 0).sum())
    state, step_metrics = p_train_step(state, sharding.global_batch(host_batch, mesh),
                                       dropout_rng)
    acc = _sum_metrics(acc, step_metrics)
    faults.after_step(step)
    preempted = preemption.requested(step)
    last = step == cfg.num_train_steps or preempted
    logging_now = step % cfg.log_every_steps == 0 or last
    saving = step % cfg.checkpoint_every_steps == 0 or last

    if logging_now or saving:
      acc = jax.device_get(acc)
      nonfinite.check(acc, step, ckpt)  # (before anything is saved)
    if logging_now:
      skipped += nonfinite.report(acc)
      elapsed = time.time() - t_last
      n = max(acc["num_tokens"], 1.0)
      logged = {"train/loss": acc["loss_sum"] / n, "train/nll": acc["nll_sum"] / n,
                "train/grad_norm": acc["grad_norm"] / max(acc["steps"] - acc["nonfinite_steps"],
                                                          1.0),
                "train/learning_rate": float(lr_fn(step - 1)),
                "train/skipped_steps": skipped,
                "perf/tokens_per_sec": real_tokens * jax.process_count() / elapsed,
                "perf/steps_per_sec": acc["steps"] / elapsed,
                "data/filtered_examples": pipeline.filter.filtered,
                "data/filtered_empty": pipeline.filter.empty,
                "data/filtered_too_long": pipeline.filter.too_long}
      writer.write(step, logged)
      progress.update(step, logged)
      acc, real_tokens, t_last = None, 0, time.time()

    if (step % cfg.eval_every_steps == 0 or last) and not preempted:
      t_eval = time.time()
      score, hyps = evaluator.bleu(state.params)
      eval_metrics = {"eval/loss": evaluator.loss(state.params), "eval/bleu": score.bleu,
                      "eval/chrf": score.chrf}
      writer.write(step, eval_metrics)
      writer.write_text(step, "eval/samples", _log_samples(evaluator.eval_set, hyps,
                                                           cfg.decode.num_samples_to_log, "eval"))
      log.info("step %d: eval loss %.4f, %s [%.1fs]", step, eval_metrics["eval/loss"],
                   score, time.time() - t_eval)
      final.update(eval_metrics)
      metrics.plot_metrics(workdir)
      best_ckpt.save(step, state, metrics={"bleu": score.bleu})
      if stopper.update(score.bleu):
        log.info("Early stopping at step %d: validation BLEU has not improved on %.2f for %d "
                 "evaluations", step, stopper.best, stopper.patience)
        last = True
      t_last = time.time()  # evaluation time does not count against training speed

    if saving or last:  # (`last` again: early stopping may have set it)
      ckpt.save(step, state, train_iter)
      t_last = time.time()
    if last:
      break

  progress.close()
  preemption.close()
  log.info("Data: %s", pipeline.filter.summary())
  if preempted:
    log.warning("Preempted: checkpoint saved at step %d in %s; rerun the same command to "
                "resume", step, ckpt.directory)
    final["preempted_at_step"] = step
  elif cfg.data.test_split:
    final.update(_test(cfg, workdir, model, state.params, tok, mesh, writer,
                       int(jax.device_get(state.step))))
  metrics.plot_metrics(workdir)
  writer.close()
  ckpt.close()
  best_ckpt.close()
  return final


BEST_CHECKPOINTS = "checkpoints_best"


class NonFiniteError(FloatingPointError):
  """A non-finite loss or gradient under config.nonfinite_updates='stop'."""


@dataclasses.dataclass
class NonFiniteGuard:
  """Acts on the non-finite steps counted in the metrics (their updates were not applied):
  'stop' raises naming the first such step, 'skip' logs them and goes on."""
  policy: str

  def check(self, acc, step: int, ckpt):
    """Under 'stop', raises if `acc` (metric sums up to `step`) counts a non-finite step."""
    if self.policy != "stop" or not acc["nonfinite_steps"]:
      return
    latest = ckpt.latest_step()
    raise NonFiniteError(
        f"non-finite loss or gradient at step {int(acc['first_nonfinite_step'])}; its update "
        f"was not applied. Stopped at step {step}; the last checkpoint "
        f"({f'step {latest}' if latest else 'none'} in {ckpt.directory}) is intact. Lower the "
        "learning rate, or set config.nonfinite_updates='skip' to skip such steps")

  def report(self, acc) -> int:
    """Logs the skipped steps counted in `acc`; returns their number."""
    count = int(acc["nonfinite_steps"])
    if count:
      log.warning("skipped %d update(s) with a non-finite loss or gradient (first at step %d)",
                  count, int(acc["first_nonfinite_step"]))
    return count


class EarlyStopping:
  """Stops when validation BLEU has not improved for `patience` evaluations (0: never)."""

  def __init__(self, patience: int, history: list[float]):
    self.patience, self.best, self.bad = patience, float("-inf"), 0
    for bleu in history:  # a resumed run continues the count where it stopped
      self.update(bleu)

  def update(self, bleu: float) -> bool:
    if bleu > self.best:
      self.best, self.bad = bleu, 0
    else:
      self.bad += 1
    return self.patience > 0 and self.bad >= self.patience


def _logged_bleus(workdir: Path, up_to_step: int) -> list[float]:
  return [r["eval/bleu"] for r in metrics.read_metrics(workdir / "metrics.jsonl")
          if "eval/bleu" in r and r["step"] <= up_to_step]


def _test(cfg, workdir, model, params, tok, mesh, writer, step) -> dict[str, float]:
  """BLEU on the test split, with its signature; writes the hypotheses to the workdir."""
  test = Evaluator("test", data.load_eval_set(cfg.data, cfg.data.test_split, tok,
                                              dataset=cfg.data.test_dataset),
                   model, cfg, mesh, tok)
  t0 = time.time()
  score, hyps = test.bleu(params)
  seconds = time.time() - t0
  _write_lines(workdir / f"{cfg.data.test_split}.hyp.{cfg.data.target_lang}", hyps)
  result = {"test/bleu": score.bleu, "test/chrf": score.chrf,
            "perf/test_decode_sentences_per_sec": len(hyps) / seconds}
  writer.write(step, result)
  samples = _log_samples(test.eval_set, hyps, cfg.decode.num_samples_to_log, "test")
  if jax.process_index() == 0:
    print(f"\n{cfg.data.test_split} ({len(hyps)} sentences, beam {cfg.decode.beam_size}, "
          f"{len(hyps) / seconds:.1f} sent/s):\n  {score}\n{samples}", flush=True)
    (workdir / "test_results.json").write_text(json.dumps(
        {"split": cfg.data.test_split, "step": step, "bleu": score.bleu,
         "bleu_signature": score.bleu_signature, "chrf": score.chrf,
         "chrf_signature": score.chrf_signature, "beam_size": cfg.decode.beam_size,
         "length_penalty": cfg.decode.length_penalty}, indent=2))
  return result
