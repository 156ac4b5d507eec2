"""AdamW with linear warmup and a decay (inverse square root, cosine, linear or none), plus
gradient clipping (optax). The optional cooldown to 0 at the end of training is
`decisions.cooldown_scale`, applied by the step as a factor on the update, since where
training ends may depend on the wall clock."""

from __future__ import annotations

import fnmatch

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from transformer_jax.config.population import is_static
from transformer_jax.config.sections import DECAY_BY_RANK, OptimizerConfig
from transformer_jax.errors import ConfigError


def learning_rate_schedule(cfg: OptimizerConfig, num_steps: int):
  """The rate of update `step` (0-based): linear warmup to the peak over warmup_steps, then
  config.optimizer.schedule: "inverse_sqrt" (∝ 1/sqrt(step), Vaswani et al. 2017),
  "cosine" or "linear" decay towards 0 at `num_steps` (the last update gets 1/(num_steps -
  warmup + 1) of the way, not 0), or "constant"."""
  at_least_1 = max if is_static(cfg.warmup_steps) else jnp.maximum  # (a member's is traced)
  warmup = at_least_1(cfg.warmup_steps, 1)
  decay_steps = at_least_1(num_steps - warmup + 1, 1)

  def schedule(step):
    t = jnp.asarray(step, jnp.float32) + 1.0  # the update's number, from 1
    if cfg.schedule == "inverse_sqrt":
      return cfg.learning_rate * jnp.minimum(t / warmup, jnp.sqrt(warmup / t))
    left = jnp.clip((num_steps - t + 1.0) / decay_steps, 0.0, 1.0)  # 1 after warmup -> ~0
    decay = {"constant": jnp.ones_like(left), "linear": left,
             "cosine": 0.5 * (1.0 - jnp.cos(jnp.pi * left))}[cfg.schedule]
    return cfg.learning_rate * jnp.where(t < warmup, t / warmup, decay)
  return schedule


def decayed(params, exclude: tuple[str, ...]):
  """A tree like `params` of whether weight decay applies to each parameter: to those whose
  path ("encoder_0/feed_forward/wo/kernel") no glob pattern of `exclude` matches. By name,
  not by rank: a scanned model's stacked norm scales and the (heads, head_dim) biases are
  left out as an unscanned model's are. (`DECAY_BY_RANK` in `exclude`: every parameter of
  fewer than two axes left out too, as runs from before the names did.)"""
  # (a parameter in its logical-axis box, as the state's initialisation has it, is one leaf:
  # the mask a prefix of the tree)
  paths, tree = jax.tree_util.tree_flatten_with_path(
      params, is_leaf=lambda x: isinstance(x, nn.meta.AxisMetadata))
  names = [jax.tree_util.keystr(path, simple=True, separator="/") for path, _ in paths]
  ranks = [len(getattr(nn.meta.unbox(leaf), "shape", ())) for _, leaf in paths]

  def excluded(pattern: str) -> list[bool]:
    if pattern == DECAY_BY_RANK:
      return [rank < 2 for rank in ranks]
    return [fnmatch.fnmatchcase(name, pattern) for name in names]

  matches = [excluded(pattern) for pattern in exclude]
  for pattern, hits in zip(exclude, matches):  # (a misspelt one would decay what it meant
    if not any(hits):                           # to leave alone)
      raise ConfigError(f"config.optimizer.weight_decay_exclude: {pattern!r} matches no "
                        f"parameter of the model (paths such as {names[-1]!r})")
  return jax.tree_util.tree_unflatten(tree, [not any(column) for column in zip(*matches)]
                                      if matches else [True] * len(names))


def make_optimizer(cfg: OptimizerConfig, num_steps: int) -> optax.GradientTransformation:
  parts = []
  if not is_static(cfg.grad_clip_norm) or cfg.grad_clip_norm > 0:
    parts.append(optax.clip_by_global_norm(cfg.grad_clip_norm))
  parts.append(optax.adamw(learning_rate_schedule(cfg, num_steps), b1=cfg.b1, b2=cfg.b2,
                           eps=cfg.eps, weight_decay=cfg.weight_decay,
                           mask=lambda params: decayed(params, cfg.weight_decay_exclude)))
  return optax.chain(*parts)
