"""The encoder–decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017), in Linen.

Shape suffixes used in names (one letter per axis):
  B batch, S source length, T target length (or query length), D d_model, H heads,
  K head dim (d_model // num_heads), F feed-forward width, V vocabulary.
Parameters carry logical axis names (embed, heads, kv, mlp, vocab) that the sharding rules in
`sharding.py` map onto mesh axes.

Numerics: with `dtype="bfloat16"`, matmul inputs are cast to bf16 and accumulated in f32
(`preferred_element_type`), the residual stream, LayerNorm and softmax stay f32. With
`dtype="float32"` everything is f32, the exact reference path.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

NEG_INF = -1e9  # added to masked attention logits; exp() of it is exactly 0 in f32


# Activation rematerialisation: what the backward pass may keep instead of recomputing.
REMAT_POLICIES = {"none": None, "full": jax.checkpoint_policies.nothing_saveable,
                  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes and options of the Transformer; built from `config.model` (unknown keys fail)."""
  vocab_size: int = 8000                  # joint source/target subword vocabulary
  d_model: int = 512                      # width of embeddings and the residual stream
  num_heads: int = 8                      # attention heads; d_model % num_heads == 0
  d_ff: int = 2048                        # hidden width of the position-wise feed-forward
  num_encoder_layers: int = 6
  num_decoder_layers: int = 6
  dropout_rate: float = 0.1               # on embeddings and each residual branch
  attention_dropout_rate: float = 0.0     # on attention weights
  ffn_dropout_rate: float = 0.0           # after the feed-forward activation
  pre_layer_norm: bool = True             # pre-LN (stable default) or the paper's post-LN
  positional_encoding: str = "sinusoidal"  # "sinusoidal" or "learned"
  max_len: int = 256                      # longest source/target position supported
  share_embeddings: bool = True           # one embedding table for source and target
  tie_output_embedding: bool = True       # output softmax uses the target embedding matrix
  dtype: str = "float32"                  # compute dtype of matmuls: float32 or bfloat16
  remat: str = "none"                     # recompute layer activations in the backward pass:
                                          # "none", "full" (save only layer inputs) or
                                          # "dots" (keep matmul outputs, recompute the rest)
  scan_layers: bool = False               # one scanned layer per stack (fast compiles for
                                          # deep models; parameters stacked on a layer axis)

  def __post_init__(self):
    if self.d_model % self.num_heads:
      raise ValueError(f"config.model.d_model={self.d_model} is not divisible by "
                       f"config.model.num_heads={self.num_heads}")
    if self.positional_encoding not in ("sinusoidal", "learned"):
      raise ValueError(f"config.model.positional_encoding={self.positional_encoding!r}: "
                       "expected 'sinusoidal' or 'learned'")
    if self.remat not in REMAT_POLICIES:
      raise ValueError(f"config.model.remat={self.remat!r}: expected one of "
                       f"{', '.join(map(repr, REMAT_POLICIES))}")
    if self.dtype not in ("float32", "bfloat16"):
      raise ValueError(f"config.model.dtype={self.dtype!r}: expected 'float32' or 'bfloat16'")
    for name in ("vocab_size", "d_model", "num_heads", "d_ff", "max_len"):
      if getattr(self, name) <= 0:
        raise ValueError(f"config.model.{name}={getattr(self, name)} must be positive")
    for name in ("dropout_rate", "attention_dropout_rate", "ffn_dropout_rate"):
      if not 0.0 <= getattr(self, name) < 1.0:
        raise ValueError(f"config.model.{name}={getattr(self, name)} must be in [0, 1)")

  @property
  def head_dim(self) -> int:
    return self.d_model // self.num_heads

  @property
  def compute_dtype(self) -> Any:
    return jnp.bfloat16 if self.dtype == "bfloat16" else jnp.float32


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 3, 4))
def _einsum(spec, a, b, dtype, b_grad_input_first=False):
  return jnp.einsum(spec, a.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)


def _einsum_fwd(spec, a, b, dtype, b_grad_input_first=False):
  a_c, b_c = a.astype(dtype), b.astype(dtype)
  out = jnp.einsum(spec, a_c, b_c, preferred_element_type=jnp.float32)
  # Zero-size sentinels carry the input dtypes (residuals must be arrays).
  return out, (a_c, b_c, jnp.zeros((0,), a.dtype), jnp.zeros((0,), b.dtype))


def _einsum_bwd(spec, dtype, b_grad_input_first, residuals, g):
  # The backward matmuls take inputs in the compute dtype too (bf16: without this rule the
  # f32 cotangent promotes them to slow f32 matmuls) and accumulate in f32. In bf16 the
  # cotangent goes first, except where `b_grad_input_first` asks otherwise: XLA:CPU has bf16
  # kernels for only some operand orders of batched products (the others fail at run time).
  a_c, b_c, a_like, b_like = residuals
  g_c = g.astype(dtype)
  inputs, out = spec.split("->")
  lhs, rhs = inputs.split(",")
  da = jnp.einsum(f"{out},{rhs}->{lhs}", g_c, b_c, preferred_element_type=jnp.float32)
  if dtype == jnp.float32:
    db = _weight_grad(spec, a_c, g_c)
  elif b_grad_input_first:
    db = jnp.einsum(f"{lhs},{out}->{rhs}", a_c, g_c, preferred_element_type=jnp.float32)
  else:
    db = jnp.einsum(f"{out},{lhs}->{rhs}", g_c, a_c, preferred_element_type=jnp.float32)
  return da.astype(a_like.dtype), db.astype(b_like.dtype)


def _weight_grad(spec, a, g):
  """d einsum(spec, a, b) / d b for a cotangent g, as one matmul contracting over the tokens.

  XLA:CPU's matmul kernel reads its first operand with the contracted axis innermost, so
  one operand gets transposed in memory: the one with fewer free elements is put first (the
  activations for the (tokens, vocab) logits, the cotangent for the FFN output projection),
  and the small result is transposed to the parameter's layout.
  """
  inputs, out = spec.split("->")
  lhs, rhs = inputs.split(",")
  strip = lambda s: s.replace("...", "")
  a_letters, g_letters = strip(lhs), strip(out)
  a_free = [c for c in a_letters if c in rhs]
  g_free = [c for c in g_letters if c in rhs]
  size = lambda x, letters, free: math.prod(x.shape[x.ndim - len(letters) + letters.index(c)]
                                            for c in free)
  if size(a, a_letters, a_free) <= size(g, g_letters, g_free):
    natural = "".join(a_free + g_free)
    db = jnp.einsum(f"{lhs},{out}->{natural}", a, g, preferred_element_type=jnp.float32)
  else:
    natural = "".join(g_free + a_free)
    db = jnp.einsum(f"{out},{lhs}->{natural}", g, a, preferred_element_type=jnp.float32)
  if natural != rhs:
    db = jnp.transpose(db, [natural.index(c) for c in rhs])
  return db


_einsum.defvjp(_einsum_fwd, _einsum_bwd)


def matmul(spec: str, a, b, dtype):
  """einsum(spec, a, b) with f32 results: exact f32, or bf16 inputs with f32 accumulation
  when `dtype` is bfloat16 (in the backward pass too, through `_einsum`'s rule)."""
  return _einsum(spec, a, b, dtype)


def attention_matmul(spec: str, a, b, dtype, b_grad_input_first: bool = False):
  """`matmul` for the batched attention products. In f32 they keep jax.grad's backward
  (`_weight_grad` is for weights); in bf16 the backward runs in bf16 too, with the operand
  order given for the second operand's gradient (see `_einsum_bwd`)."""
  if dtype == jnp.float32:
    return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
  return _einsum(spec, a, b, dtype, b_grad_input_first)


def _param(module, name, init, shape, axes):
  return module.param(name, nn.with_logical_partitioning(init, axes), shape, jnp.float32)


class Projection(nn.Module):
  """A linear map contracting the trailing `len(in_shape)` axes of x into `out_shape` axes."""
  in_shape: tuple[int, ...]
  out_shape: tuple[int, ...]
  axes: tuple[str, ...]  # logical names of the kernel's axes (in..., out...)
  dtype: Any = jnp.float32
  use_bias: bool = True

  @nn.compact
  def __call__(self, x):
    fan_in = math.prod(self.in_shape)
    fan_out = math.prod(self.out_shape)
    # Xavier-uniform over the flattened (fan_in, fan_out) matrix, whatever the axis split.
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    init = lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -limit, limit)
    kernel = _param(self, "kernel", init, self.in_shape + self.out_shape, self.axes)
    letters = "abcdefgh"
    n_in, n_out = len(self.in_shape), len(self.out_shape)
    contract, out = letters[:n_in], letters[n_in:n_in + n_out]
    y = matmul(f"...{contract},{contract}{out}->...{out}", x, kernel, self.dtype)
    if self.use_bias:
      y = y + _param(self, "bias", nn.initializers.zeros, self.out_shape,
                     self.axes[len(self.in_shape):])
    return y


def sinusoidal_positions(max_len: int, d_model: int) -> np.ndarray:
  """The paper's fixed encodings: sin on even, cos on odd dims, wavelengths 2π…10000·2π."""
  position = np.arange(max_len)[:, None]
  div_term = np.exp(np.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
  table = np.zeros((max_len, d_model), dtype=np.float32)
  table[:, 0::2] = np.sin(position * div_term)
  table[:, 1::2] = np.cos(position * div_term)[:, : d_model // 2]
  return table


class Embedding(nn.Module):
  """Token embedding scaled by sqrt(d_model); `attend` gives output logits (tied softmax)."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.table_VD = _param(self, "embedding", nn.initializers.normal(cfg.d_model ** -0.5),
                           (cfg.vocab_size, cfg.d_model), ("vocab", "embed"))

  def __call__(self, ids_BT):
    return jnp.take(self.table_VD, ids_BT, axis=0) * math.sqrt(self.config.d_model)

  def attend(self, x_BTD):
    return matmul("btd,vd->btv", x_BTD, self.table_VD, self.config.compute_dtype)


class PositionalEncoding(nn.Module):
  """Adds sinusoidal (or learned) position encodings at the given positions.

  With `decode=True` the position is the step count kept in the 'cache' collection.
  """
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, positions_BT, decode: bool = False):
    cfg = self.config
    if decode:
      started = self.has_variable("cache", "position")
      position = self.variable("cache", "position", lambda: jnp.array(0, dtype=jnp.int32))
      positions_BT = jnp.broadcast_to(position.value, x_BTD.shape[:2])
      if started:
        position.value = position.value + 1
    if cfg.positional_encoding == "learned":
      table = _param(self, "position_embedding", nn.initializers.normal(0.02),
                     (cfg.max_len, cfg.d_model), (None, "embed"))
    else:
      table = jnp.asarray(sinusoidal_positions(cfg.max_len, cfg.d_model))
    return x_BTD + jnp.take(table, positions_BT, axis=0)


def scaled_dot_product_attention(q_BTHK, k_BSHK, v_BSHK, mask_BHTS, dtype,
                                 dropout: nn.Module | None = None, kv_layout: str = "bshk"):
  """softmax(Q K^T / sqrt(d_k)) V over each head; returns (output_BTHK, weights_BHTS).

  Keys and values are (B, S, H, K), or (B, H, S, K) with `kv_layout="bhsk"` (the decoding
  cache, kept head-major so that no step transposes the whole cache)."""
  q_BTHK = q_BTHK / math.sqrt(q_BTHK.shape[-1])
  logits_BHTS = attention_matmul(f"bthk,{kv_layout}->bhts", q_BTHK, k_BSHK, dtype)
  logits_BHTS = jnp.where(mask_BHTS, logits_BHTS, NEG_INF)
  weights_BHTS = jax.nn.softmax(logits_BHTS, axis=-1)
  dropped_BHTS = weights_BHTS if dropout is None else dropout(weights_BHTS)
  out_BTHK = attention_matmul(f"bhts,{kv_layout}->bthk", dropped_BHTS, v_BSHK, dtype,
                              b_grad_input_first=True)
  return out_BTHK, weights_BHTS


class MultiHeadAttention(nn.Module):
  """Q/K/V projections split into heads, scaled dot-product attention, heads merged back.

  With `decode=True`, self-attention keeps keys/values of earlier steps in a 'cache' variable
  and cross-attention computes the encoder's keys/values once, when the cache is created.
  """
  config: ModelConfig
  is_cross_attention: bool = False

  @nn.compact
  def __call__(self, x_BTD, context_BSD, mask_BHTS, deterministic: bool, decode: bool = False):
    cfg = self.config
    H, K, D, dtype = cfg.num_heads, cfg.head_dim, cfg.d_model, cfg.compute_dtype
    split_heads = lambda name: Projection((D,), (H, K), ("embed", "heads", "kv"), dtype, name=name)
    q_BTHK = split_heads("query")(x_BTD)

    kv_layout = "bshk"
    rows = q_BTHK.shape[0]
    if decode and self.is_cross_attention:
      # Encoder keys/values never change while decoding: compute them when the cache is made.
      if not self.has_variable("cache", "cached_key"):
        # (kept in the compute dtype: the attention matmuls cast them to it anyway)
        for name, kind in (("cached_key", "key"), ("cached_value", "value")):
          self.variable("cache", name,
                        lambda kind=kind: split_heads(kind)(context_BSD).astype(dtype))
      k_BSHK = self.get_variable("cache", "cached_key")
      v_BSHK = self.get_variable("cache", "cached_value")
      # The encoder ran once per sentence; its `beams` decoder rows (consecutive) query the
      # same keys/values, as extra query positions: (B*W, T) -> (B, W*T).
      q_BTHK = q_BTHK.reshape((k_BSHK.shape[0], -1) + q_BTHK.shape[2:])
    else:
      k_BSHK = split_heads("key")(context_BSD)
      v_BSHK = split_heads("value")(context_BSD)
      if decode:
        k_BSHK, v_BSHK, mask_BHTS, kv_layout = self._update_self_attention_cache(
            k_BSHK, v_BSHK, mask_BHTS)

    dropout = None
    if cfg.attention_dropout_rate > 0 and not deterministic:
      dropout = functools.partial(Dropout(cfg.attention_dropout_rate), deterministic=False)
    out_BTHK, weights_BHTS = scaled_dot_product_attention(q_BTHK, k_BSHK, v_BSHK, mask_BHTS,
                                                          dtype, dropout, kv_layout)
    self.sow("intermediates", "attention_weights", weights_BHTS)
    out_BTHK = out_BTHK.reshape((rows, -1) + out_BTHK.shape[2:])
    merge_heads = Projection((H, K), (D,), ("heads", "kv", "embed"), dtype, name="output")
    return merge_heads(out_BTHK)

  def _update_self_attention_cache(self, k_B1HK, v_B1HK, mask_BHTS):
    """Writes this step's key/value at the cache index; attends to positions <= index.
    Returns keys, values, mask and their layout: the cache is kept as (B, H, max_len, K), in
    the compute dtype (bf16 halves the cache traffic); each step writes one contiguous (H, K)
    slice per row (the (B, H, K, max_len) layout wrote strided columns, 10% slower overall)."""
    initialized = self.has_variable("cache", "cached_key")
    B, L, H, K = k_B1HK.shape  # (when the cache is created: L = max_len)
    dtype = self.config.compute_dtype
    cached_key = self.variable("cache", "cached_key", jnp.zeros, (B, H, L, K), dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, (B, H, L, K), dtype)
    index = self.variable("cache", "index", lambda: jnp.array(0, dtype=jnp.int32))
    if not initialized:  # creating the cache (full-length dummy input): nothing to attend to
      return k_B1HK, v_B1HK, mask_BHTS, "bshk"
    if L != 1:
      raise ValueError(f"cached decoding takes one token per step, got {L}")
    i = index.value
    to_cache = lambda x_B1HK: x_B1HK.transpose(0, 2, 1, 3).astype(dtype)  # (B, H, 1, K)
    cached_key.value = jax.lax.dynamic_update_slice(cached_key.value, to_cache(k_B1HK),
                                                    (0, 0, i, 0))
    cached_value.value = jax.lax.dynamic_update_slice(cached_value.value, to_cache(v_B1HK),
                                                      (0, 0, i, 0))
    index.value = i + 1
    max_len = cached_key.value.shape[2]
    causal_11TS = (jnp.arange(max_len) <= i)[None, None, None, :]
    return cached_key.value, cached_value.value, causal_11TS, "bhsk"


class Dropout(nn.Module):
  """Inverted dropout: zeroes each element with probability `rate`, scales the rest by
  1 / (1 - rate).

  The keep decisions come from a counter-based generator: each element's index, mixed with
  two 32-bit seeds drawn from the 'dropout' key by two rounds of the murmur3 finalizer (an
  invertible avalanche mix). It costs a few integer operations per element, fused into the
  dropout itself, where drawing threefry bits per element was most of dropout's cost on CPU
  (bf16 base-shape training step: 3% faster than 16-bit threefry draws, 8% faster than
  flax's nn.Dropout). The rate is exact to 2^-32.
  """
  rate: float

  @nn.compact
  def __call__(self, x, deterministic: bool):
    if deterministic or self.rate == 0.0:
      return x
    seeds = jax.random.bits(self.make_rng("dropout"), (2,), jnp.uint32)
    bits = _fmix32(_fmix32(_element_index(x.shape) ^ seeds[0]) + seeds[1])
    keep = bits >= np.uint32(min(round(self.rate * 2.0 ** 32), 2 ** 32 - 1))
    return jnp.where(keep, x / (1.0 - self.rate), jnp.zeros_like(x))


def _element_index(shape):
  """Each element's row-major index (mod 2^32), as uint32."""
  index = jnp.zeros(shape, jnp.uint32)
  stride = 1
  for axis in reversed(range(len(shape))):
    index = index + jax.lax.broadcasted_iota(jnp.uint32, shape, axis) * np.uint32(stride % 2**32)
    stride *= shape[axis]
  return index


def _fmix32(h):
  """murmur3's 32-bit finalizer: a bijection in which every input bit flips about half of
  the output bits."""
  h = h ^ (h >> 16)
  h = h * np.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * np.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


class FeedForward(nn.Module):
  """Position-wise feed-forward: Linear(D->F), ReLU, dropout, Linear(F->D)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, deterministic: bool):
    cfg = self.config
    h_BTF = Projection((cfg.d_model,), (cfg.d_ff,), ("embed", "mlp"), cfg.compute_dtype,
                       name="wi")(x_BTD)
    # In bf16 the activations are rounded here rather than inside `wo`: the same numbers
    # (ReLU commutes with rounding), half the memory traffic for the (B, T, d_ff) array.
    h_BTF = nn.relu(h_BTF.astype(cfg.compute_dtype))
    h_BTF = Dropout(cfg.ffn_dropout_rate)(h_BTF, deterministic=deterministic)
    return Projection((cfg.d_ff,), (cfg.d_model,), ("mlp", "embed"), cfg.compute_dtype,
                      name="wo")(h_BTF)


class ResidualBlock(nn.Module):
  """x + Dropout(sublayer(LN(x))) (pre-LN) or LN(x + Dropout(sublayer(x))) (post-LN)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, sublayer, deterministic: bool):
    cfg = self.config
    norm = nn.LayerNorm(name="layer_norm", param_dtype=jnp.float32)
    dropout = Dropout(cfg.dropout_rate)
    if cfg.pre_layer_norm:
      return x_BTD + dropout(sublayer(norm(x_BTD)), deterministic=deterministic)
    return norm(x_BTD + dropout(sublayer(x_BTD), deterministic=deterministic))


class EncoderLayer(nn.Module):
  """Self-attention over the source (padding mask), then the feed-forward block."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BSD, mask_BHSS, deterministic: bool):
    cfg = self.config
    attention = MultiHeadAttention(cfg, name="self_attention")
    ffn = FeedForward(cfg, name="feed_forward")
    x_BSD = ResidualBlock(cfg, name="attention_block")(
        x_BSD, lambda h: attention(h, h, mask_BHSS, deterministic), deterministic)
    return ResidualBlock(cfg, name="ffn_block")(
        x_BSD, lambda h: ffn(h, deterministic), deterministic)


class DecoderLayer(nn.Module):
  """Masked (causal) self-attention, encoder–decoder attention, then the feed-forward block."""
  config: ModelConfig

  @nn.compact
  def __call__(self, y_BTD, encoded_BSD, self_mask_BHTT, cross_mask_BHTS, deterministic: bool,
               decode: bool = False):
    cfg = self.config
    self_attention = MultiHeadAttention(cfg, name="self_attention")
    cross_attention = MultiHeadAttention(cfg, is_cross_attention=True, name="cross_attention")
    ffn = FeedForward(cfg, name="feed_forward")
    y_BTD = ResidualBlock(cfg, name="self_attention_block")(
        y_BTD, lambda h: self_attention(h, h, self_mask_BHTT, deterministic, decode),
        deterministic)
    y_BTD = ResidualBlock(cfg, name="cross_attention_block")(
        y_BTD, lambda h: cross_attention(h, encoded_BSD, cross_mask_BHTS, deterministic, decode),
        deterministic)
    return ResidualBlock(cfg, name="ffn_block")(
        y_BTD, lambda h: ffn(h, deterministic), deterministic)


class ScannedEncoderLayer(EncoderLayer):
  """EncoderLayer in nn.scan's (carry, output) form."""

  def __call__(self, x_BSD, mask_BHSS, deterministic: bool):
    return super().__call__(x_BSD, mask_BHSS, deterministic), None


class ScannedDecoderLayer(DecoderLayer):
  """DecoderLayer in nn.scan's (carry, output) form (training and scoring; decoding uses the
  per-layer form, see `unstack_layers`)."""

  def __call__(self, y_BTD, encoded_BSD, self_mask_BHTT, cross_mask_BHTS, deterministic: bool):
    return super().__call__(y_BTD, encoded_BSD, self_mask_BHTT, cross_mask_BHTS,
                            deterministic), None


def _layer_stack(cfg: ModelConfig, layer_cls, num_layers: int, static_argnums, prefix: str):
  """The layers of one stack: `num_layers` modules named {prefix}_{i}, or one nn.scan over a
  layer whose parameters have a leading 'layers' axis; rematerialised if configured."""
  if cfg.remat != "none":
    layer_cls = nn.remat(layer_cls, policy=REMAT_POLICIES[cfg.remat],
                         prevent_cse=not cfg.scan_layers, static_argnums=static_argnums)
  if not cfg.scan_layers:
    return [layer_cls(cfg, name=f"{prefix}_{i}") for i in range(num_layers)]
  scanned = nn.scan(layer_cls, variable_axes={"params": 0, "intermediates": 0},
                    split_rngs={"params": True, "dropout": True},
                    in_axes=nn.broadcast,  # masks, encoder output, flags: the same each layer
                    length=num_layers, metadata_params={nn.PARTITION_NAME: "layers"})
  return scanned(cfg, name=f"{prefix}_layers")


def unstack_layers(params, cfg: ModelConfig):
  """Scanned parameters (one stacked entry per stack) in the per-layer layout."""
  params = dict(params)
  for prefix, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
    stacked = params.pop(f"{prefix}_layers")
    for i in range(n):
      params[f"{prefix}_{i}"] = jax.tree_util.tree_map(lambda x, i=i: x[i], stacked)
  return params


def stack_layers(params, cfg: ModelConfig):
  """Per-layer parameters in the scanned layout (the inverse of `unstack_layers`)."""
  params = dict(params)
  for prefix, n in (("encoder", cfg.num_encoder_layers), ("decoder", cfg.num_decoder_layers)):
    layers = [params.pop(f"{prefix}_{i}") for i in range(n)]
    params[f"{prefix}_layers"] = jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)
  return params


def padding_mask(query_BT, key_BS):
  """True where both the query and the key token are real (non-padding), as (B, 1, T, S)."""
  return ((query_BT > 0)[:, None, :, None]) & ((key_BS > 0)[:, None, None, :])


def segment_mask(query_segments_BT, key_segments_BS):
  """True where query and key belong to the same packed example, as (B, 1, T, S)."""
  return query_segments_BT[:, None, :, None] == key_segments_BS[:, None, None, :]


def causal_mask(length: int):
  """True where the key position is not after the query position, as (1, 1, T, T)."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def shift_right(targets_BT, positions_BT=None):
  """Decoder inputs: targets moved one step right, with 0 (the start token) at each start."""
  shifted_BT = jnp.pad(targets_BT, ((0, 0), (1, 0)))[:, :-1]
  if positions_BT is not None:  # packed rows: every example starts with its own start token
    shifted_BT = jnp.where(positions_BT == 0, 0, shifted_BT)
  return shifted_BT


def default_positions(ids_BT):
  return jnp.broadcast_to(jnp.arange(ids_BT.shape[1], dtype=jnp.int32), ids_BT.shape)


class Transformer(nn.Module):
  """Encoder–decoder Transformer; `__call__` gives training logits, `encode`/`decode` decode."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.source_embedding = Embedding(cfg)
    self.target_embedding = self.source_embedding if cfg.share_embeddings else Embedding(cfg)
    self.source_positional_encoding = PositionalEncoding(cfg)
    # A module of its own on the target side: in decode mode it keeps the step count.
    self.target_positional_encoding = PositionalEncoding(cfg)
    self.embedding_dropout = Dropout(cfg.dropout_rate)
    # (self counts as argument 0 for nn.remat's static_argnums: `deterministic`, `decode`)
    if cfg.scan_layers:
      self.encoder_stack = _layer_stack(cfg, ScannedEncoderLayer, cfg.num_encoder_layers, (3,),
                                        "encoder")
      self.decoder_stack = _layer_stack(cfg, ScannedDecoderLayer, cfg.num_decoder_layers, (5,),
                                        "decoder")
    else:
      self.encoder_layers = _layer_stack(cfg, EncoderLayer, cfg.num_encoder_layers, (3,),
                                         "encoder")
      self.decoder_layers = _layer_stack(cfg, DecoderLayer, cfg.num_decoder_layers, (5, 6),
                                         "decoder")
    if cfg.pre_layer_norm:  # pre-LN leaves the stack's output unnormalised: one final LN each
      self.encoder_norm = nn.LayerNorm(name="encoder_norm", param_dtype=jnp.float32)
      self.decoder_norm = nn.LayerNorm(name="decoder_norm", param_dtype=jnp.float32)
    if not cfg.tie_output_embedding:
      self.output_projection = Projection((cfg.d_model,), (cfg.vocab_size,), ("embed", "vocab"),
                                          cfg.compute_dtype, use_bias=False)

  def encode(self, inputs_BS, inputs_positions_BS=None, inputs_segmentation_BS=None,
             train: bool = False):
    """Encoder output (B, S, D) for source ids (0 = padding)."""
    if inputs_positions_BS is None:
      inputs_positions_BS = default_positions(inputs_BS)
    mask_B1SS = padding_mask(inputs_BS, inputs_BS)
    if inputs_segmentation_BS is not None:
      mask_B1SS &= segment_mask(inputs_segmentation_BS, inputs_segmentation_BS)
    x_BSD = self.source_positional_encoding(self.source_embedding(inputs_BS), inputs_positions_BS)
    x_BSD = self.embedding_dropout(x_BSD, deterministic=not train)
    if self.config.scan_layers:
      x_BSD, _ = self.encoder_stack(x_BSD, mask_B1SS, not train)
    else:
      for layer in self.encoder_layers:
        x_BSD = layer(x_BSD, mask_B1SS, not train)
    return self.encoder_norm(x_BSD) if self.config.pre_layer_norm else x_BSD

  def decode(self, encoded_BSD, inputs_BS, decoder_inputs_BT, targets_BT=None,
             targets_positions_BT=None, inputs_segmentation_BS=None,
             targets_segmentation_BT=None, train: bool = False, decode: bool = False,
             return_hidden: bool = False):
    """Logits (B, T, V) over the next token given decoder inputs (the shifted targets).

    Teacher forcing needs `targets_BT` (for the padding mask). With `decode=True` it runs one
    step (T == 1) against the cache: the position and the causal mask come from the cache.
    """
    cfg = self.config
    T = decoder_inputs_BT.shape[1]
    if decode:
      positions_BT = None  # kept in the cache by the positional encoding
      self_mask_B1TT = causal_mask(T)  # used only when the cache is created
      cross_mask_B1TS = (inputs_BS > 0)[:, None, None, :]
    else:
      positions_BT = (default_positions(decoder_inputs_BT) if targets_positions_BT is None
                      else targets_positions_BT)
      self_mask_B1TT = padding_mask(targets_BT, targets_BT) & causal_mask(T)
      cross_mask_B1TS = padding_mask(targets_BT, inputs_BS)
      if targets_segmentation_BT is not None:
        self_mask_B1TT &= segment_mask(targets_segmentation_BT, targets_segmentation_BT)
        cross_mask_B1TS &= segment_mask(targets_segmentation_BT, inputs_segmentation_BS)
    y_BTD = self.target_positional_encoding(self.target_embedding(decoder_inputs_BT),
                                            positions_BT, decode)
    y_BTD = self.embedding_dropout(y_BTD, deterministic=not train)
    if cfg.scan_layers:
      if decode:
        raise ValueError("cached decoding needs the per-layer layout: use "
                         "model.unscanned(model, params)")
      y_BTD, _ = self.decoder_stack(y_BTD, encoded_BSD, self_mask_B1TT, cross_mask_B1TS,
                                    not train)
    else:
      for layer in self.decoder_layers:
        y_BTD = layer(y_BTD, encoded_BSD, self_mask_B1TT, cross_mask_B1TS, not train, decode)
    if cfg.pre_layer_norm:
      y_BTD = self.decoder_norm(y_BTD)
    if return_hidden:  # the softmax layer's input and matrix (fused_loss computes the rest)
      if not cfg.tie_output_embedding:
        raise ValueError("return_hidden needs tie_output_embedding")
      return y_BTD, self.target_embedding.table_VD
    if cfg.tie_output_embedding:
      return self.target_embedding.attend(y_BTD)
    return self.output_projection(y_BTD)

  def __call__(self, inputs_BS, targets_BT, inputs_positions_BS=None, targets_positions_BT=None,
               inputs_segmentation_BS=None, targets_segmentation_BT=None, train: bool = False,
               return_hidden: bool = False):
    """Teacher-forced logits (B, T, V): predicts targets[t] from source and targets[<t]
    (or, with `return_hidden`, the final hidden states (B, T, D) and the output matrix)."""
    encoded_BSD = self.encode(inputs_BS, inputs_positions_BS, inputs_segmentation_BS, train)
    decoder_inputs_BT = shift_right(targets_BT, targets_positions_BT)
    return self.decode(encoded_BSD, inputs_BS, decoder_inputs_BT, targets_BT,
                       targets_positions_BT, inputs_segmentation_BS, targets_segmentation_BT,
                       train, return_hidden=return_hidden)

  def init_cache(self, encoded_BSD, inputs_BS, max_decode_len: int, beams: int = 1):
    """Creates the decoding cache (run with mutable=['cache']): empty self-attention
    keys/values of `beams` hypotheses per sentence for `max_decode_len` steps, and the
    encoder's cross-attention keys/values, once per sentence. Decoding steps then take
    B * beams rows, each sentence's hypotheses consecutive."""
    dummy_BT = jnp.zeros((inputs_BS.shape[0] * beams, max_decode_len), jnp.int32)
    return self.decode(encoded_BSD, inputs_BS, dummy_BT, decode=True)


def unscanned(model: Transformer, params):
  """The same model in the per-layer layout (what cached decoding runs on)."""
  if not model.config.scan_layers:
    return model, params
  cfg = dataclasses.replace(model.config, scan_layers=False)
  return Transformer(cfg), unstack_layers(params, model.config)
