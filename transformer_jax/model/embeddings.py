"""Linear projections, token embeddings and position encodings (shape legend: model/__init__.py)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.config.model import ModelConfig
from transformer_jax.ops.matmul import matmul
from transformer_jax.ops.platform import traced_for


def compute_dtype(cfg: ModelConfig) -> Any:
  """The dtype matmul inputs are cast to (config.model.dtype, once "auto" is resolved)."""
  if cfg.dtype == "auto":
    raise ValueError('config.model.dtype="auto" must be resolved first (parallel.numerics)')
  return jnp.bfloat16 if cfg.dtype == "bfloat16" else jnp.float32


def activation_dtype(cfg: ModelConfig) -> Any:
  """The dtype of what flows between matmuls inside a block (the projections' outputs and the
  sublayers' LayerNorm outputs): bf16 with config.model.activation_dtype="bfloat16" and bf16
  matmuls, else None (f32, as the matmuls accumulate). The residual stream, LayerNorm
  statistics, softmax and the loss stay f32 either way. "auto" is bf16 in a program traced
  for GPUs (the compile tool counts 3% less HBM traffic for wmt_base's step; the H200's
  faster step with it ran last of its variants: BENCHMARKS.md, "GPU targets: the H200
  calibration"), f32 elsewhere (TPUs and CPUs as before: measured on neither)."""
  wanted = cfg.activation_dtype
  if wanted == "auto":
    wanted = "bfloat16" if traced_for() == "gpu" else "float32"
  if wanted == "bfloat16" and compute_dtype(cfg) == jnp.bfloat16:
    return jnp.bfloat16
  return None


def _param(module, name, init, shape, axes):
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


class Projection(nn.Module):
  """A linear map contracting the trailing `len(in_shape)` axes of x into `out_shape` axes."""
  in_shape: tuple[int, ...]
  out_shape: tuple[int, ...]
  axes: tuple[str, ...]  # logical names of the kernel's axes (in..., out...)
  dtype: Any = jnp.float32
  use_bias: bool = True
  out_dtype: Any = None  # the output's dtype (None: f32, as accumulated)

  @nn.compact
  def __call__(self, x):
    fan_in = math.prod(self.in_shape)
    fan_out = math.prod(self.out_shape)
    # Xavier-uniform over the flattened (fan_in, fan_out) matrix, whatever the axis split.
    limit = math.sqrt(6.0 / (fan_in + fan_out))

    def init(key, shape, dtype):
      return jax.random.uniform(key, shape, dtype, -limit, limit)

    kernel = _param(self, "kernel", init, self.in_shape + self.out_shape, self.axes)
    letters = "abcdefgh"
    n_in, n_out = len(self.in_shape), len(self.out_shape)
    contract, out = letters[:n_in], letters[n_in:n_in + n_out]
    y = matmul(f"...{contract},{contract}{out}->...{out}", x, kernel, self.dtype)
    if self.out_dtype is not None:
      y = y.astype(self.out_dtype)
    if self.use_bias:
      bias = _param(self, "bias", nn.initializers.zeros, self.out_shape,
                    self.axes[len(self.in_shape):])
      y = y + bias.astype(y.dtype)
    return y


def sinusoidal_positions(max_len: int, d_model: int, concat: bool = False) -> np.ndarray:
  """The paper's fixed encodings: sin on even, cos on odd dims, wavelengths 2π…10000·2π; with
  `concat`, the same sines in the first half of the dims and the cosines in the second
  (tensor2tensor's, fairseq's and Marian's layout)."""
  position = np.arange(max_len)[:, None]
  div_term = np.exp(np.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
  table = np.zeros((max_len, d_model), dtype=np.float32)
  sines, cosines = (slice(0, (d_model + 1) // 2), slice((d_model + 1) // 2, None)) if concat \
      else (slice(0, None, 2), slice(1, None, 2))
  table[:, sines] = np.sin(position * div_term)
  table[:, cosines] = np.cos(position * div_term)[:, : d_model // 2]
  return table


ROTARY_BASE = 10000.0  # the wavelengths of rotary positions, as of the sinusoidal ones


def _rotary_angles(positions, half: int):
  inverse_wavelengths = ROTARY_BASE ** (-jnp.arange(half, dtype=jnp.float32) / half)
  return positions[..., None].astype(jnp.float32) * inverse_wavelengths


@functools.lru_cache(maxsize=None)
def rotary_table(length: int, half: int) -> tuple[np.ndarray, np.ndarray]:
  """(sin, cos) of the rotary angles of positions 0..length-1, (length, half) f32, computed
  once by XLA's own f32 sin and cos: a lookup gives the bits computing them in the program
  would."""
  with jax.ensure_compile_time_eval():
    angles_LK = _rotary_angles(jnp.arange(length), half)
    return np.asarray(jnp.sin(angles_LK)), np.asarray(jnp.cos(angles_LK))


def rotary(x_BTHK, positions_BT, max_len: int):
  """Rotary position embedding (Su et al., RoFormer): each pair (x[i], x[i + K/2]) of a head
  rotated by position * ROTARY_BASE^(-2i/K), so that a query-key product depends on the two
  positions only through their difference. In f32; returns x's dtype.

  On CPUs sin and cos are looked up (`rotary_table`; positions in 0 .. max_len - 1, at or
  past `max_len` NaN, not a silently wrong angle): computed in the program, XLA:CPU fuses
  them into each rotation and evaluates them per element, a visible part of a decoding step
  (BENCHMARKS.md, "Decoding on CPUs past CTranslate2 float32"). Elsewhere they are
  computed."""
  half = x_BTHK.shape[-1] // 2
  if traced_for() == "cpu":
    sin_LK, cos_LK = rotary_table(max_len, half)
    sin_BTK, cos_BTK = (jnp.take(table_LK, positions_BT, axis=0, mode="fill",
                                 fill_value=np.nan) for table_LK in (sin_LK, cos_LK))
  else:
    angles_BTK = _rotary_angles(positions_BT, half)
    sin_BTK, cos_BTK = jnp.sin(angles_BTK), jnp.cos(angles_BTK)
  sin_BT1K, cos_BT1K = sin_BTK[:, :, None], cos_BTK[:, :, None]
  x = x_BTHK.astype(jnp.float32)
  a, b = x[..., :half], x[..., half:]
  return jnp.concatenate([a * cos_BT1K - b * sin_BT1K, b * cos_BT1K + a * sin_BT1K],
                         axis=-1).astype(x_BTHK.dtype)


def relative_position_bucket(offset, bidirectional: bool, num_buckets: int, max_distance: int):
  """T5's buckets of key-minus-query offsets: exact for small distances, then logarithmic up
  to `max_distance`, beyond which all share the last; with `bidirectional` (the encoder) half
  of the buckets are for keys after the query, else (causal) keys after it fall in bucket 0."""
  n = -offset
  bucket = jnp.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    bucket += (n < 0).astype(n.dtype) * num_buckets
    n = jnp.abs(n)
  else:
    n = jnp.maximum(n, 0)
  max_exact = num_buckets // 2
  large = max_exact + (jnp.log(n.astype(jnp.float32) / max_exact + jnp.finfo(jnp.float32).eps)
                       / math.log(max_distance / max_exact)
                       * (num_buckets - max_exact)).astype(n.dtype)
  large = jnp.minimum(large, num_buckets - 1)
  return bucket + jnp.where(n < max_exact, n, large)


class Embedding(nn.Module):
  """Token embedding scaled by sqrt(d_model) (unless config.model.scale_embeddings is off);
  `attend` gives output logits (tied softmax)."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.table_VD = _param(self, "embedding", nn.initializers.normal(cfg.d_model ** -0.5),
                           (cfg.vocab_size, cfg.d_model), ("vocab", "embed"))

  def __call__(self, ids_BT):
    x_BTD = jnp.take(self.table_VD, ids_BT, axis=0)
    return x_BTD * math.sqrt(self.config.d_model) if self.config.scale_embeddings else x_BTD

  def attend(self, x_BTD):
    if self.has_variable("prepared", "output_DV"):  # (`prepared_output`: decoding's copy)
      return matmul("btd,dv->btv", x_BTD, self.get_variable("prepared", "output_DV"),
                    compute_dtype(self.config))
    return matmul("btd,vd->btv", x_BTD, self.table_VD, compute_dtype(self.config))


def prepared_output(params, dtype):
  """The 'prepared' variables a decoding step reads beside `params`: each embedding table as
  the output layer's matrix, transposed and in the compute dtype once, not at each step (or
  at each call of a decoding program, which would hoist it out of its loop)."""
  def walk(tree):
    out = {}
    for name, value in tree.items():
      if name == "embedding" and not isinstance(value, Mapping):
        out["output_DV"] = value.T.astype(dtype)
      elif isinstance(value, Mapping) and (sub := walk(value)):
        out[name] = sub
    return out
  return walk(params)


class PositionalEncoding(nn.Module):
  """Adds sinusoidal (or learned) position encodings at the given positions (nothing for
  rotary and relative positions, which self-attention applies); a decoding step gives each
  row's own position."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, positions_BT):
    cfg = self.config
    if cfg.positional_encoding in ("rotary", "relative"):
      return x_BTD  # (positions enter in self-attention)
    if cfg.positional_encoding == "learned":
      table = _param(self, "position_embedding", nn.initializers.normal(0.02),
                     (cfg.max_len, cfg.d_model), (None, "embed"))
    else:
      table = jnp.asarray(sinusoidal_positions(
          cfg.max_len, cfg.d_model, concat=cfg.positional_encoding == "sinusoidal_concat"))
    return x_BTD + jnp.take(table, positions_BT, axis=0)

