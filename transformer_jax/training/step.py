"""The pure training step: loss, gradients (accumulated over micro-batches if configured), and
an optimizer update that is applied only when the loss and gradients are finite."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax

from transformer_jax.model.embeddings import compute_dtype
from transformer_jax.model.transformer import apply_to_batch
from transformer_jax.ops.interleave import split_interleaved
from transformer_jax.ops.losses import cross_entropy, device_output_loss
from transformer_jax.parallel import fsdp
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.parallel.mesh import BATCH_AXES
from transformer_jax.training.state import TrainState


def training_loss_sums(model, params, batch, rngs, label_smoothing: float, mesh=None):
  """(smoothed loss sum, NLL sum, token count) of a training batch. With a tied softmax the
  output layer and loss run fused, in tiles of tokens, on each device of `mesh` for its own
  rows (`ops.losses.device_output_loss`); otherwise (an untied softmax, or one with an output
  bias) through the model's logits."""
  targets_BT = batch["targets"]
  if not model.config.tie_output_embedding or model.config.output_bias:
    logits = apply_to_batch(model, params, batch, True, rngs)
    return cross_entropy(logits, targets_BT, targets_BT > 0, label_smoothing)
  hidden_BTD, table_VD = apply_to_batch(model, params, batch, True, rngs, return_hidden=True)
  return device_output_loss(
      hidden_BTD.reshape(-1, hidden_BTD.shape[-1]), table_VD, targets_BT.reshape(-1),
      (targets_BT > 0).reshape(-1).astype(jnp.float32), label_smoothing,
      compute_dtype(model.config), model.config.loss_tile_tokens, mesh, BATCH_AXES,
      model.config.logits_dtype)


def _loss_sums(model, params, batch, rngs, label_smoothing, mesh, param_shardings):
  """`training_loss_sums` over the step's mesh; with FSDP (`param_shardings`) per device, the
  gradients reduce-scattered (`parallel.fsdp`)."""
  if param_shardings is None:
    return training_loss_sums(model, params, batch, rngs, label_smoothing, mesh)
  # (each device its own rows: the output loss needs no mesh of its own)
  return fsdp.loss_sums_per_device(
      functools.partial(training_loss_sums, model, label_smoothing=label_smoothing),
      params, batch, rngs, param_shardings, BATCH_AXES)


def ema_decay_at(decay: float, step):
  """The moving average's decay at update `step` (1-based): min(decay, (1 + step) / (10 +
  step)), as TensorFlow's ExponentialMovingAverage with num_updates, so that the first
  updates are not averaged with the initial weights for thousands of steps (0.999 alone
  still gives them 37% of the weight after 1,000 steps)."""
  step = jnp.asarray(step, jnp.float32)
  return jnp.minimum(decay, (1.0 + step) / (10.0 + step))


def train_step(state: TrainState, batch, rng, lr_scale=1.0, *, model, label_smoothing: float,
               num_micro_batches: int = 1, nonfinite_at_step: int = 0, mesh=None, tx=None,
               ema_decay=None, param_shardings=None):
  """One optimizer step; returns the new state and metric sums with their denominators.

  `lr_scale` multiplies the update (for AdamW: the learning rate, weight decay included): the
  cooldown factor of `decisions.cooldown_scale`.

  With `num_micro_batches` k > 1 the batch is processed as k micro-batches (gradient
  accumulation): the summed gradients over all of them, divided by the batch's token count,
  are the full batch's gradient, at 1/k of the activation memory.

  A non-finite loss or gradient is never applied: the step counter advances, parameters,
  their moving average and the optimizer state stay as they were, and the metrics count it
  (`nonfinite_steps`, and the step in `first_nonfinite_step`); the loop then stops or goes on
  (config.nonfinite_updates).
  `nonfinite_at_step` injects NaN gradients at that step (preemption.Faults, for tests).
  `mesh` (the one the step is jitted over) lets the output loss run per device;
  `param_shardings`: the parameters' shardings when `fsdp` splits them (None otherwise): the
  loss per device, the gradients reduce-scattered (`parallel.fsdp`). `tx` and `ema_decay`,
  when given, stand for the state's own (a population member's, built from its traced values:
  `training.population`).
  """
  dropout_rng = jax.random.fold_in(rng, state.step)

  def loss_fn(params, batch, rngs):
    loss_sum, nll_sum, num_tokens = _loss_sums(model, params, batch, rngs, label_smoothing,
                                               mesh, param_shardings)
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
  updates, opt_state = (tx or state.tx).update(grads, state.opt_state, state.params)
  updates = jax.tree_util.tree_map(lambda u: u * lr_scale, updates)
  updated = state.replace(step=step, params=optax.apply_updates(state.params, updates),
                          opt_state=opt_state)
  if getattr(state, "ema_params", None) is not None:  # (the parameters' moving average)
    d = ema_decay_at(state.ema_decay if ema_decay is None else ema_decay, step)
    updated = updated.replace(ema_params=jax.tree_util.tree_map(
        lambda e, p: d * e + (1.0 - d) * p, state.ema_params, updated.params))
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
  micro_batches = jax.tree_util.tree_map(lambda x: split_interleaved(x, k), batch)
  (grads, sums), _ = jax.lax.scan(body, zeros, (jnp.arange(k), micro_batches))
  grads = jax.tree_util.tree_map(lambda g: g / jnp.maximum(sums[2], 1.0), grads)
  return grads, sums



def compile_step(cfg, model, mesh, state_sharding, nonfinite_at_step: int = 0):
  """`train_step` jitted over `mesh` for config `cfg`: (state, batch, rng[, lr_scale]) ->
  (state, metric sums), the state donated. The cooldown factor is an argument only when there
  is a cooldown: without one the step compiles with the constant 1, the same program (and
  bits) as a step without the factor."""
  replicated = mesh_lib.replicated(mesh)
  lr_scale_sharding = (replicated,) if cfg.optimizer.cooldown_fraction > 0 else ()
  return jax.jit(
      functools.partial(train_step, model=model, label_smoothing=cfg.label_smoothing,
                        num_micro_batches=cfg.num_micro_batches,
                        nonfinite_at_step=nonfinite_at_step, mesh=mesh,
                        param_shardings=state_sharding.params
                        if mesh.shape["fsdp"] > 1 else None),
      in_shardings=(state_sharding, mesh_lib.batch_sharding(mesh), replicated,
                    *lr_scale_sharding),
      out_shardings=(state_sharding, replicated),
      donate_argnums=(0,))
