"""AdamW with linear warmup and inverse-square-root decay, plus gradient clipping (optax)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
  """Optimizer and schedule; built from `config.optimizer`."""
  learning_rate: float = 1e-3   # peak, reached at the end of warmup
  warmup_steps: int = 4000      # linear warmup from 0; then lr * sqrt(warmup_steps / step)
  b1: float = 0.9
  b2: float = 0.98
  eps: float = 1e-9
  weight_decay: float = 0.0     # decoupled (AdamW), on matrices only
  grad_clip_norm: float = 1.0   # global-norm clipping; 0 disables

  def __post_init__(self):
    if self.learning_rate <= 0:
      raise ValueError(f"config.optimizer.learning_rate={self.learning_rate} must be positive")
    if self.warmup_steps < 0:
      raise ValueError(f"config.optimizer.warmup_steps={self.warmup_steps} must be >= 0")


def learning_rate_schedule(cfg: OptimizerConfig):
  """Linear warmup to the peak, then decay ∝ 1/sqrt(step) (Vaswani et al. 2017)."""
  warmup = max(cfg.warmup_steps, 1)

  def schedule(step):
    step = jnp.asarray(step, jnp.float32) + 1.0
    return cfg.learning_rate * jnp.minimum(step / warmup, jnp.sqrt(warmup / step))
  return schedule


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
  decay_mask = lambda params: jax.tree_util.tree_map(lambda p: p.ndim > 1, params)
  parts = []
  if cfg.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.grad_clip_norm))
  parts.append(optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay, mask=decay_mask))
  return optax.chain(*parts)
