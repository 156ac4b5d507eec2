"""AdamW with linear warmup and inverse-square-root decay, plus gradient clipping (optax), and
the optional cooldown to 0 at the end of training (applied by the step as a factor on the
update, since where training ends may depend on the wall clock)."""

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


def cooldown_scale(fraction: float, step: int, num_steps: int, minutes: float = 0.0,
                   budget_minutes: float = 0.0) -> float:
  """The factor on the learning rate of update `step` (1-based): 1, then linear to 0 over the
  last `fraction` of training. Training ends at `num_steps` or, with a time budget, when
  `minutes` reach `budget_minutes`, whichever comes first, so a run that the budget stops
  ends cooled down like one that reaches its last step. `fraction` 0: always 1."""
  if fraction <= 0:
    return 1.0
  left = (num_steps - step + 1) / num_steps
  if budget_minutes > 0:
    left = min(left, max(budget_minutes - minutes, 0.0) / budget_minutes)
  return min(1.0, left / fraction)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:

  def decay_mask(params):  # weight decay on matrices, not on biases and LayerNorm scales
    return jax.tree_util.tree_map(lambda p: p.ndim > 1, params)

  parts = []
  if cfg.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.grad_clip_norm))
  parts.append(optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay, mask=decay_mask))
  return optax.chain(*parts)
