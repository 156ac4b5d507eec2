"""Attention: the masks, scaled dot-product attention, and multi-head attention with Q/K/V
projections split into heads and merged back, keeping a key/value cache when decoding (shape
legend: model/__init__.py)."""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.config.model import ModelConfig
from transformer_jax.config.population import is_static
from transformer_jax.model.embeddings import (
  Projection,
  activation_dtype,
  compute_dtype,
  relative_position_bucket,
  rotary,
)
from transformer_jax.ops.attention import softmax_once_attention
from transformer_jax.ops.dropout import Dropout
from transformer_jax.ops.masking import NEG_INF
from transformer_jax.ops.matmul import attention_matmul
from transformer_jax.ops.platform import traced_for


def padding_mask(query_BT, key_BS):
  """True where both the query and the key token are real (non-padding), as (B, 1, T, S)."""
  return ((query_BT > 0)[:, None, :, None]) & ((key_BS > 0)[:, None, None, :])


def segment_mask(query_segments_BT, key_segments_BS):
  """True where query and key belong to the same packed example, as (B, 1, T, S)."""
  return query_segments_BT[:, None, :, None] == key_segments_BS[:, None, None, :]


def causal_mask(length: int):
  """True where the key position is not after the query position, as (1, 1, T, T)."""
  return jnp.tril(jnp.ones((length, length), dtype=bool))[None, None]


def attention_implementation(cfg: ModelConfig, platform: str | None = None) -> str:
  """config.model.attention_impl with "auto" resolved for `platform` (default: the one the
  program is traced for, ops.platform): cuDNN's fused attention on GPUs where its
  constraints hold (bf16 inputs, head_dim a multiple of 8 up to 128); on TPUs the softmax
  evaluated once (ops.attention: the TPU compiler predicts wmt_base's and wmt_big's steps
  faster with it than with jax.nn.dot_product_attention's XLA implementation, and that
  faster than the einsum products: BENCHMARKS.md, "The TPU memory wall"); our einsum
  products elsewhere (tuned for XLA:CPU)."""
  if cfg.attention_impl != "auto":
    return cfg.attention_impl
  platform = platform or traced_for()
  if (platform == "gpu" and compute_dtype(cfg) == jnp.bfloat16
      and cfg.head_dim % 8 == 0 and cfg.head_dim <= 128):
    return "cudnn"
  return "softmax_once" if platform == "tpu" else "einsum"


def fused_attention(q_BTHK, k_BSHK, v_BSHK, mask_BHTS, dtype, implementation: str,
                    bias_BHTS=None):
  """The same softmax(Q K^T / sqrt(d_k) + bias) V through jax.nn.dot_product_attention (XLA's
  or cuDNN's kernel), for (B, S, H, K) keys and values; returns the output in f32 (no
  weights: the fused kernels never materialise them)."""
  out_BTHK = jax.nn.dot_product_attention(
      q_BTHK.astype(dtype), k_BSHK.astype(dtype), v_BSHK.astype(dtype),
      bias=None if bias_BHTS is None else bias_BHTS.astype(dtype),
      mask=jnp.broadcast_to(mask_BHTS, (q_BTHK.shape[0], 1) + mask_BHTS.shape[2:]),
      implementation=implementation)
  return out_BTHK.astype(jnp.float32)


def scaled_dot_product_attention(q_BTHK, k_BSHK, v_BSHK, mask_BHTS, dtype,
                                 dropout: nn.Module | None = None, kv_layout: str = "bshk",
                                 bias_BHTS=None):
  """softmax(Q K^T / sqrt(d_k) + bias) V over each head; returns (output_BTHK, weights_BHTS).

  Keys and values are (B, S, H, K), or (B, H, S, K) with `kv_layout="bhsk"` (the decoding
  cache, kept head-major so that no step transposes the whole cache; no gradient).
  `bias_BHTS`: relative position biases (None: none)."""
  q_BTHK = q_BTHK / math.sqrt(q_BTHK.shape[-1])
  logits_BHTS = attention_matmul(f"bthk,{kv_layout}->bhts", q_BTHK, k_BSHK, dtype)
  if bias_BHTS is not None:
    logits_BHTS = logits_BHTS + bias_BHTS
  logits_BHTS = jnp.where(mask_BHTS, logits_BHTS, NEG_INF)
  weights_BHTS = jax.nn.softmax(logits_BHTS, axis=-1)
  dropped_BHTS = weights_BHTS if dropout is None else dropout(weights_BHTS)
  if kv_layout == "bhsk":
    # (the head-major product, then the small output transposed: asked for (B, T, H, K)
    # directly, XLA:CPU runs the product with its operands swapped, far slower for several
    # rows' queries of one source's keys (figures: docs/design/decoding.md); decoding only:
    # no backward order to keep)
    out_BHTK = attention_matmul("bhts,bhsk->bhtk", dropped_BHTS, v_BSHK, dtype)
    return out_BHTK.transpose(0, 2, 1, 3), weights_BHTS
  out_BTHK = attention_matmul(f"bhts,{kv_layout}->bthk", dropped_BHTS, v_BSHK, dtype,
                              b_grad_input_first=True)
  return out_BTHK, weights_BHTS


def repeat_kv_heads(x, groups: int, layout: str):
  """Grouped-query attention's keys or values, each of its heads repeated for the `groups`
  query heads that share it (query head h reads key/value head h // groups)."""
  if groups == 1:
    return x
  return jnp.repeat(x, groups, axis=layout.index("h"))


def write_slots(cache_BHSK, new_BHRK, first_B):
  """The cache with row b's slots first_B[b] .. first_B[b] + R - 1 replaced by its R new
  ones (`new_BHRK`); each first a multiple of R below the cache's length (a step's slots,
  as the decoding cache writes them; rows decoding at positions of their own).

  A select of the new slots over the cache (a scatter of per-row offsets runs on XLA:CPU as
  a loop over the updated elements, slower). A 16-bit cache is selected over as 16-bit
  integers, the same bits: XLA:CPU runs a 16-bit-float select through f32, converting the
  whole cache there and back (figures: docs/design/decoding.md)."""
  S, R = cache_BHSK.shape[2], new_BHRK.shape[2]
  dtype = cache_BHSK.dtype
  new_BHRK = new_BHRK.astype(dtype)
  as_bits = jnp.dtype(dtype).itemsize == 2 and jnp.issubdtype(dtype, jnp.floating)
  if as_bits:
    cache_BHSK, new_BHRK = (jax.lax.bitcast_convert_type(x, jnp.uint16)
                            for x in (cache_BHSK, new_BHRK))
  slot_1S = jnp.arange(S)[None, :]
  first_B1 = first_B[:, None]
  written_B1S1 = ((slot_1S >= first_B1) & (slot_1S < first_B1 + R))[:, None, :, None]
  # slot first + r holds new r: first is a multiple of R, so slot s takes new s % R
  written = jnp.where(written_B1S1, jnp.tile(new_BHRK, (1, 1, S // R, 1)), cache_BHSK)
  return jax.lax.bitcast_convert_type(written, dtype) if as_bits else written


class MultiHeadAttention(nn.Module):
  """Q/K/V projections split into heads, scaled dot-product attention, heads merged back.

  With config.model.num_kv_heads below num_heads (grouped-query attention), K and V have
  fewer heads, each shared by num_heads / num_kv_heads query heads: a smaller decoding cache.
  Rotary or relative positions (config.model.positional_encoding) enter self-attention here,
  at `positions_BT` (decoding: each row's step).
  With `cached=True` (one decoding step against the cache), self-attention keeps keys/values
  of earlier steps in a 'cache' variable
  and cross-attention computes the encoder's keys/values once, when the cache is created.
  """
  config: ModelConfig
  is_cross_attention: bool = False
  causal: bool = False  # the decoder's self-attention (relative buckets for earlier keys only)

  @nn.compact
  def __call__(self, x_BTD, context_BSD, mask_BHTS, deterministic: bool, cached: bool = False,
               positions_BT=None):
    cfg = self.config
    H, K, D, dtype = cfg.num_heads, cfg.head_dim, cfg.d_model, compute_dtype(cfg)
    G = cfg.kv_heads  # key/value heads (H: the paper's attention)

    def split_heads(name):  # the Q, K or V projection: (B, T, D) -> (B, T, H or G, K)
      heads = H if name == "query" else G
      project = Projection((D,), (heads, K), ("embed", "heads", "kv"), dtype, name=name)
      if not (cfg.qk_norm and name in ("query", "key") and not self.is_cross_attention):
        return project
      # QK-norm: each head's vector RMS-normalised over its K dimensions, one learned scale
      # per dimension shared by the heads, before rotary positions rotate it. Self-attention
      # only, as decoder-only models have it: CTranslate2 (4.8) normalises a cross-attention
      # query over all its heads at once, which would export as another function.
      norm = nn.RMSNorm(epsilon=cfg.norm_epsilon, param_dtype=jnp.float32,
                        name=f"{name}_norm")

      def normalised(x_BTD):
        y_BTHK = project(x_BTD)
        return norm(y_BTHK).astype(y_BTHK.dtype)
      return normalised

    q_BTHK = split_heads("query")(x_BTD)

    kv_layout, bias_BHTS = "bshk", None
    rows = q_BTHK.shape[0]
    if cached and self.is_cross_attention:
      # Encoder keys/values never change while decoding: compute them when the cache is made.
      if not self.has_variable("cache", "cached_key"):
        # (kept in the compute dtype, which the attention matmuls cast them to anyway, and
        # head-major, the layout they read: no step transposes them)
        for name, kind in (("cached_key", "key"), ("cached_value", "value")):
          self.variable("cache", name, lambda kind=kind: split_heads(kind)(
              context_BSD).astype(dtype).transpose(0, 2, 1, 3))
      k_BSHK = self.get_variable("cache", "cached_key")
      v_BSHK = self.get_variable("cache", "cached_value")
      kv_layout = "bhsk"  # (k_BSHK, v_BSHK hold (B, H, S, K) here)
      # The encoder ran once per source; the R decoder rows of a source (consecutive) query
      # the same keys/values, as extra query positions: (B*R, T) -> (B, R*T).
      q_BTHK = q_BTHK.reshape((k_BSHK.shape[0], -1) + q_BTHK.shape[2:])
    else:
      k_BSHK = split_heads("key")(context_BSD)
      v_BSHK = split_heads("value")(context_BSD)
      # Positions inside attention (self-attention only; cross-attention has none).
      scheme = "" if self.is_cross_attention else cfg.positional_encoding
      query_positions_BT, key_positions_BS = self._positions(positions_BT, q_BTHK, cached)
      if scheme == "rotary":
        q_BTHK = rotary(q_BTHK, query_positions_BT, self.config.max_len)
        k_BSHK = rotary(k_BSHK, query_positions_BT, self.config.max_len)  # (the same positions)
      if cached:
        k_BSHK, v_BSHK, mask_BHTS, kv_layout = self._update_self_attention_cache(
            k_BSHK, v_BSHK, mask_BHTS, query_positions_BT)
      if scheme == "relative":
        bias_BHTS = self._relative_bias(query_positions_BT, key_positions_BS)
      if cached and k_BSHK.shape[0] < rows:
        # R rows share one cache (`_update_self_attention_cache`) and query it as extra
        # positions, each through its own mask of the slots it reads: (B*R, 1) -> (B, R).
        q_BTHK = q_BTHK.reshape((k_BSHK.shape[0], -1) + q_BTHK.shape[2:])
        if bias_BHTS is not None:  # (B*R, H, 1, S) -> (B, H, R, S)
          bias_BHTS = bias_BHTS.reshape((q_BTHK.shape[0], -1) + bias_BHTS.shape[1:]
                                        ).squeeze(3).transpose(0, 2, 1, 3)

    dropout = None
    rate = cfg.attention_dropout_rate  # (a population's is traced: taken as not 0)
    if not deterministic and (not is_static(rate) or rate > 0):
      dropout = functools.partial(Dropout(cfg.attention_dropout_rate), deterministic=False)
    implementation = attention_implementation(cfg)
    if implementation == "einsum" or dropout is not None or cached:
      k_BSHK, v_BSHK = (repeat_kv_heads(x, H // G, kv_layout) for x in (k_BSHK, v_BSHK))
      out_BTHK, weights_BHTS = scaled_dot_product_attention(q_BTHK, k_BSHK, v_BSHK, mask_BHTS,
                                                            dtype, dropout, kv_layout,
                                                            bias_BHTS)
      self.sow("intermediates", "attention_weights", weights_BHTS)
    elif implementation == "softmax_once":
      k_BSHK, v_BSHK = (repeat_kv_heads(x, H // G, kv_layout) for x in (k_BSHK, v_BSHK))
      out_BTHK = softmax_once_attention(q_BTHK, k_BSHK, v_BSHK, mask_BHTS, bias_BHTS, dtype)
    else:  # (decoding and attention dropout take the einsum path above, as attention maps do;
      # the fused kernels take G key/value heads as they are)
      out_BTHK = fused_attention(q_BTHK, k_BSHK, v_BSHK, mask_BHTS, dtype, implementation,
                                 bias_BHTS)
    out_BTHK = out_BTHK.reshape((rows, -1) + out_BTHK.shape[2:])
    merge_heads = Projection((H, K), (D,), ("heads", "kv", "embed"), dtype, name="output",
                             out_dtype=activation_dtype(cfg))
    return merge_heads(out_BTHK)

  def _positions(self, positions_BT, q_BTHK, cached: bool):
    """(query positions (B, T), key positions (B or 1, S)) of self-attention. Decoding: each
    row's step and every cache slot's; creating the cache, or without given positions:
    0..T-1."""
    B, T = q_BTHK.shape[:2]
    if positions_BT is None:
      positions_BT = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    if cached and self.has_variable("cache", "cached_key"):
      cached = self.get_variable("cache", "cached_key")
      per_step = B // cached.shape[0]  # (slots a step fills: one per row sharing the cache)
      slots = jnp.arange(cached.shape[2], dtype=jnp.int32)
      return positions_BT, (slots // per_step)[None]
    return positions_BT, positions_BT

  def _relative_bias(self, query_positions_BT, key_positions_BS):
    """T5's relative position bias (B, H, T, S): a learned scalar per head and offset
    bucket (own table per layer)."""
    cfg = self.config
    table_NH = self.param("relative_bias", nn.with_logical_partitioning(
        nn.initializers.variance_scaling(1.0, "fan_avg", "uniform"), (None, "heads")),
        (cfg.relative_num_buckets, cfg.num_heads), jnp.float32)
    offsets_BTS = key_positions_BS[:, None, :] - query_positions_BT[:, :, None]
    buckets_BTS = relative_position_bucket(offsets_BTS, not self.causal,
                                           cfg.relative_num_buckets, cfg.relative_max_distance)
    return jnp.take(table_NH, buckets_BTS, axis=0).transpose(0, 3, 1, 2)

  def _update_self_attention_cache(self, k_B1HK, v_B1HK, mask_BHTS, positions_B1):
    """Writes this step's key/value of each row at its position (`positions_B1`); attends
    to the positions up to it. Returns keys, values, mask and their layout: the cache is kept
    as (B, H, max_len, K), in the compute dtype (bf16 halves the cache traffic); each step
    writes one contiguous (H, K) slice per row (the (B, H, K, max_len) layout wrote strided
    columns, slower: BENCHMARKS.md, "Against the PyTorch peer"). The cache keeps no step
    counter: its rows may hold sentences at different steps (`decoding.slots`).

    A cache of fewer rows than the step's is shared by R consecutive rows (see
    `Transformer.init_cache`), which decode at one position: (B, H, R * C, K), step i's
    keys/values at slots i * R .. i * R + R - 1, never moved; `mask_BHTS` (B, 1, R, R * C)
    then says which slots each row reads."""
    initialized = self.has_variable("cache", "cached_key")
    B, L, H, K = k_B1HK.shape  # (when the cache is created: L = max_len)
    dtype = compute_dtype(self.config)
    cached_key = self.variable("cache", "cached_key", jnp.zeros, (B, H, L, K), dtype)
    cached_value = self.variable("cache", "cached_value", jnp.zeros, (B, H, L, K), dtype)
    if not initialized:  # creating the cache (full-length dummy input): nothing to attend to
      return k_B1HK, v_B1HK, mask_BHTS, "bshk"
    if L != 1:
      raise ValueError(f"cached decoding takes one token per step, got {L}")

    rows = cached_key.value.shape[0]  # (the step's B rows, or B / R shared caches)
    R = B // rows
    if R > 1 and mask_BHTS.shape != (rows, 1, R, cached_key.value.shape[2]):
      raise ValueError(f"a cache shared by {R} rows is read through their masks of slots "
                       f"({rows}, 1, {R}, {cached_key.value.shape[2]}), got {mask_BHTS.shape}")
    step_B = positions_B1[::R, 0]  # (a shared cache's rows are at one step)

    def to_cache(x_B1HK):  # (rows * R, 1, H, K) -> (rows, H, R, K), in the cache's dtype
      return x_B1HK.reshape(rows, R, H, K).transpose(0, 2, 1, 3).astype(dtype)

    cached_key.value = write_slots(cached_key.value, to_cache(k_B1HK), step_B * R)
    cached_value.value = write_slots(cached_value.value, to_cache(v_B1HK), step_B * R)
    if R > 1:
      return cached_key.value, cached_value.value, mask_BHTS, "bhsk"
    max_len = cached_key.value.shape[2]
    causal_B11S = (jnp.arange(max_len)[None, :] <= step_B[:, None])[:, None, None, :]
    return cached_key.value, cached_value.value, causal_B11S, "bhsk"
