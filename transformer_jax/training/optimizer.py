"""AdamW with linear warmup and inverse-square-root decay, plus gradient clipping (optax)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from transformer_jax.config.sections import OptimizerConfig


def learning_rate_schedule(cfg: OptimizerConfig):
  """Linear warmup to the peak, then decay ∝ 1/sqrt(step) (Vaswani et al. 2017)."""
  warmup = max(cfg.warmup_steps, 1)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32) + 1.0
    return cfg.learning_rate * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))
  return schedule


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:

  def decay_mask(params):  # weight decay on matrices, not on biases and LayerNorm scales
    return jax.tree_util.tree_map(lambda p: p.ndim > 1, params)

  parts = []
  if cfg.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.grad_clip_norm))
  parts.append(optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay, mask=decay_mask))
  return optax.chain(*parts)
