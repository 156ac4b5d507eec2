"""The Transformer: position-wise feed-forward, residual blocks with LayerNorm, the encoder and
decoder layers and stacks, and the encoder–decoder model (shape legend: model/__init__.py)."""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from transformer_jax.config.model import GATED_ACTIVATIONS, ModelConfig
from transformer_jax.model.attention import (
  MultiHeadAttention,
  causal_mask,
  padding_mask,
  segment_mask,
)
from transformer_jax.model.embeddings import (
  Embedding,
  PositionalEncoding,
  Projection,
  activation_dtype,
  compute_dtype,
)
from transformer_jax.ops.dropout import Dropout

# Activation rematerialisation: what the backward pass may keep instead of recomputing.
REMAT_POLICIES = {"none": None, "full": jax.checkpoint_policies.nothing_saveable,
                  "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}


# The feed-forward activations; the gated ones multiply act(x W_gate) by x W_up.
ACTIVATIONS = {"relu": nn.relu, "gelu": functools.partial(nn.gelu, approximate=False),
               "silu": nn.silu, "swiglu": nn.silu,
               "geglu": functools.partial(nn.gelu, approximate=False)}


class FeedForward(nn.Module):
  """Position-wise feed-forward: Linear(D->F), ReLU (or GELU, SiLU), dropout, Linear(F->D); or,
  gated (SwiGLU, GeGLU: Shazeer 2020), act(Linear_gate(x)) * Linear_up(x) before dropout."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, deterministic: bool):
    cfg = self.config
    activation = ACTIVATIONS[cfg.ffn_activation]

    def expand(name):  # (B, T, D) -> (B, T, F)
      return Projection((cfg.d_model,), (cfg.d_ff,), ("embed", "mlp"), compute_dtype(cfg),
                        name=name)(x_BTD)

    if cfg.ffn_activation in GATED_ACTIVATIONS:
      h_BTF = activation(expand("wi_gate")) * expand("wi_up")
    else:
      h_BTF = activation(expand("wi"))
    # In bf16 the activations are rounded here rather than inside `wo`: half the memory
    # traffic for the (B, T, d_ff) array.
    h_BTF = h_BTF.astype(compute_dtype(cfg))
    h_BTF = Dropout(cfg.ffn_dropout_rate)(h_BTF, deterministic=deterministic)
    return Projection((cfg.d_ff,), (cfg.d_model,), ("mlp", "embed"), compute_dtype(cfg),
                      name="wo", out_dtype=activation_dtype(cfg))(h_BTF)


def make_norm(cfg: ModelConfig, name: str, dtype=None) -> nn.Module:
  """The configured normalisation (f32 parameters and statistics, output in `dtype`):
  LayerNorm (the paper's), or RMSNorm (x / rms(x) * scale: no centring, no bias)."""
  if cfg.norm == "rmsnorm":
    return nn.RMSNorm(epsilon=cfg.norm_epsilon, name=name, param_dtype=jnp.float32, dtype=dtype)
  return nn.LayerNorm(epsilon=cfg.norm_epsilon, name=name, param_dtype=jnp.float32, dtype=dtype)


class ResidualBlock(nn.Module):
  """x + Dropout(sublayer(LN(x))) (pre-LN) or LN(x + Dropout(sublayer(x))) (post-LN); LN is
  config.model.norm (LayerNorm or RMSNorm)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BTD, sublayer, deterministic: bool):
    cfg = self.config
    # Pre-LN: the norm feeds the sublayer's matmuls (in the activation dtype; its statistics
    # in f32). Post-LN: it is the residual stream, which stays f32 (the TPU compiler predicts
    # a bf16 stream slower: BENCHMARKS.md, "The TPU memory wall").
    norm = make_norm(cfg, "layer_norm", activation_dtype(cfg) if cfg.pre_layer_norm else None)
    dropout = Dropout(cfg.dropout_rate)
    if cfg.pre_layer_norm:
      return x_BTD + dropout(sublayer(norm(x_BTD)), deterministic=deterministic)
    return norm(x_BTD + dropout(sublayer(x_BTD), deterministic=deterministic))


class EncoderLayer(nn.Module):
  """Self-attention over the source (padding mask), then the feed-forward block. (`positions`:
  the tokens' positions, for rotary or relative positions.)"""
  config: ModelConfig

  @nn.compact
  def __call__(self, x_BSD, mask_BHSS, deterministic: bool, positions_BS=None):
    cfg = self.config
    attention = MultiHeadAttention(cfg, name="self_attention")
    ffn = FeedForward(cfg, name="feed_forward")
    x_BSD = ResidualBlock(cfg, name="attention_block")(
        x_BSD, lambda h: attention(h, h, mask_BHSS, deterministic, positions_BT=positions_BS),
        deterministic)
    return ResidualBlock(cfg, name="ffn_block")(
        x_BSD, lambda h: ffn(h, deterministic), deterministic)


class DecoderLayer(nn.Module):
  """Masked (causal) self-attention, encoder–decoder attention, then the feed-forward block."""
  config: ModelConfig

  @nn.compact
  def __call__(self, y_BTD, encoded_BSD, self_mask_BHTT, cross_mask_BHTS, deterministic: bool,
               cached: bool = False, positions_BT=None):
    cfg = self.config
    self_attention = MultiHeadAttention(cfg, causal=True, name="self_attention")
    cross_attention = MultiHeadAttention(cfg, is_cross_attention=True, name="cross_attention")
    ffn = FeedForward(cfg, name="feed_forward")
    y_BTD = ResidualBlock(cfg, name="self_attention_block")(
        y_BTD, lambda h: self_attention(h, h, self_mask_BHTT, deterministic, cached,
                                        positions_BT), deterministic)
    y_BTD = ResidualBlock(cfg, name="cross_attention_block")(
        y_BTD, lambda h: cross_attention(h, encoded_BSD, cross_mask_BHTS, deterministic, cached),
        deterministic)
    return ResidualBlock(cfg, name="ffn_block")(
        y_BTD, lambda h: ffn(h, deterministic), deterministic)


class ScannedEncoderLayer(EncoderLayer):
  """EncoderLayer in nn.scan's (carry, output) form."""

  def __call__(self, x_BSD, mask_BHSS, deterministic: bool, positions_BS=None):
    return super().__call__(x_BSD, mask_BHSS, deterministic, positions_BS), None


class ScannedDecoderLayer(DecoderLayer):
  """DecoderLayer in nn.scan's (carry, output) form (training and scoring; decoding uses the
  per-layer form, see `unstack_layers`)."""

  def __call__(self, y_BTD, encoded_BSD, self_mask_BHTT, cross_mask_BHTS, deterministic: bool,
               positions_BT=None):
    return super().__call__(y_BTD, encoded_BSD, self_mask_BHTT, cross_mask_BHTS,
                            deterministic, False, positions_BT), None


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


def shift_right(targets_BT, positions_BT=None):
  """Decoder inputs: targets moved one step right, with 0 (the start token) at each start."""
  shifted_BT = jnp.pad(targets_BT, ((0, 0), (1, 0)))[:, :-1]
  if positions_BT is not None:  # packed rows: every example starts with its own start token
    shifted_BT = jnp.where(positions_BT == 0, 0, shifted_BT)
  return shifted_BT


def default_positions(ids_BT):
  return jnp.broadcast_to(jnp.arange(ids_BT.shape[1], dtype=jnp.int32), ids_BT.shape)


class Transformer(nn.Module):
  """Encoder–decoder Transformer; `__call__` gives training logits; `encode`, `init_cache` and
  `decoder_logits` with `cached=True` translate step by step (`model.stepwise`)."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.source_embedding = Embedding(cfg)
    self.target_embedding = self.source_embedding if cfg.share_embeddings else Embedding(cfg)
    self.source_positional_encoding = PositionalEncoding(cfg)
    # A module of its own on the target side: decoding step by step, it keeps the step count.
    self.target_positional_encoding = PositionalEncoding(cfg)
    self.embedding_dropout = Dropout(cfg.dropout_rate)
    # (self counts as argument 0 for nn.remat's static_argnums: `deterministic`, `cached`)
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
      # (their outputs only feed matmuls: the cross-attention K/V, the output layer)
      self.encoder_norm = make_norm(cfg, "encoder_norm", activation_dtype(cfg))
      self.decoder_norm = make_norm(cfg, "decoder_norm", activation_dtype(cfg))
    if not cfg.tie_output_embedding:
      self.output_projection = Projection((cfg.d_model,), (cfg.vocab_size,), ("embed", "vocab"),
                                          compute_dtype(cfg), use_bias=False)
    if cfg.output_bias:  # (Marian's final_logits_bias; tied or untied softmax alike)
      self.output_logits_bias = self.param(
          "output_logits_bias", nn.with_logical_partitioning(nn.initializers.zeros, ("vocab",)),
          (cfg.vocab_size,), jnp.float32)

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
      x_BSD, _ = self.encoder_stack(x_BSD, mask_B1SS, not train, inputs_positions_BS)
    else:
      for layer in self.encoder_layers:
        x_BSD = layer(x_BSD, mask_B1SS, not train, inputs_positions_BS)
    return self.encoder_norm(x_BSD) if self.config.pre_layer_norm else x_BSD

  def decoder_logits(self, encoded_BSD, inputs_BS, decoder_inputs_BT, targets_BT=None,
             targets_positions_BT=None, inputs_segmentation_BS=None,
                     targets_segmentation_BT=None, train: bool = False, cached: bool = False,
                     return_hidden: bool = False, readable_BRS=None):
    """Logits (B, T, V) over the next token given decoder inputs (the shifted targets).

    Teacher forcing needs `targets_BT` (for the padding mask). With `cached=True` it runs one
    step (T == 1) against the cache, each row at its own position (`targets_positions_BT`,
    (B, 1): the tokens it has generated so far), reading the cache up to it, or, for R rows
    sharing one cache (`init_cache`), the slots of its R * C that `readable_BRS` (B, R,
    R * C) says.
    """
    cfg = self.config
    T = decoder_inputs_BT.shape[1]
    if cached:
      positions_BT = (default_positions(decoder_inputs_BT) if targets_positions_BT is None
                      else targets_positions_BT)
      # (the causal mask: used only when the cache is created)
      self_mask_B1TT = causal_mask(T) if readable_BRS is None else readable_BRS[:, None]
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
                                            positions_BT)
    y_BTD = self.embedding_dropout(y_BTD, deterministic=not train)
    if cfg.scan_layers:
      if cached:
        raise ValueError("cached decoding needs the per-layer layout: use "
                         "model.unscanned(model, params)")
      y_BTD, _ = self.decoder_stack(y_BTD, encoded_BSD, self_mask_B1TT, cross_mask_B1TS,
                                    not train, positions_BT)
    else:
      for layer in self.decoder_layers:
        y_BTD = layer(y_BTD, encoded_BSD, self_mask_B1TT, cross_mask_B1TS, not train, cached,
                      positions_BT)
    if cfg.pre_layer_norm:
      y_BTD = self.decoder_norm(y_BTD)
    if return_hidden:  # the softmax layer's input and matrix (ops.losses.output_loss does the rest)
      if not cfg.tie_output_embedding or cfg.output_bias:
        raise ValueError("return_hidden needs tie_output_embedding and no output_bias")
      return y_BTD, self.target_embedding.table_VD
    if cfg.tie_output_embedding:
      logits_BTV = self.target_embedding.attend(y_BTD)
    else:
      logits_BTV = self.output_projection(y_BTD)
    if cfg.output_bias:
      logits_BTV = logits_BTV + self.output_logits_bias
    return logits_BTV

  def __call__(self, inputs_BS, targets_BT, inputs_positions_BS=None, targets_positions_BT=None,
               inputs_segmentation_BS=None, targets_segmentation_BT=None, train: bool = False,
               return_hidden: bool = False):
    """Teacher-forced logits (B, T, V): predicts targets[t] from source and targets[<t]
    (or, with `return_hidden`, the final hidden states (B, T, D) and the output matrix)."""
    encoded_BSD = self.encode(inputs_BS, inputs_positions_BS, inputs_segmentation_BS, train)
    decoder_inputs_BT = shift_right(targets_BT, targets_positions_BT)
    return self.decoder_logits(encoded_BSD, inputs_BS, decoder_inputs_BT, targets_BT,
                               targets_positions_BT, inputs_segmentation_BS,
                               targets_segmentation_BT, train, return_hidden=return_hidden)

  def init_cache(self, encoded_BSD, inputs_BS, length: int, rows_per_source: int = 1):
    """Creates the decoding cache (run with mutable=['cache']): empty self-attention
    keys/values of `rows_per_source` decoder rows per source for `length` steps, and
    the encoder's cross-attention keys/values, once per source. Decoding steps then take
    B * rows_per_source rows, each source's rows consecutive. (A cache whose R rows share
    their self-attention keys/values, R slots a step: `model.stepwise`'s shared cache.)"""
    dummy_BT = jnp.zeros((inputs_BS.shape[0] * rows_per_source, length), jnp.int32)
    return self.decoder_logits(encoded_BSD, inputs_BS, dummy_BT, cached=True)


def unscanned(model: Transformer, params):
  """The same model in the per-layer layout (what cached decoding runs on)."""
  if not model.config.scan_layers:
    return model, params
  cfg = dataclasses.replace(model.config, scan_layers=False)
  return Transformer(cfg), unstack_layers(params, model.config)


def apply_to_batch(model: Transformer, params, batch, train: bool, rngs=None,
                   return_hidden: bool = False):
  """The model on a batch dict as the data pipelines make it (`inputs`, `targets` and, when
  packed, their `*_positions` and `*_segment_ids`)."""
  return model.apply(
      {"params": params}, batch["inputs"], batch["targets"],
      inputs_positions_BS=batch.get("inputs_positions"),
      targets_positions_BT=batch.get("targets_positions"),
      inputs_segmentation_BS=batch.get("inputs_segment_ids"),
      targets_segmentation_BT=batch.get("targets_segment_ids"),
      train=train, rngs=rngs, return_hidden=return_hidden)
