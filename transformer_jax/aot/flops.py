"""The model's FLOPs counted from its config (matrix products only, 2 per multiply-add): what
model FLOPs utilisation (MFU) divides by. Attention is counted over whole rows, as the
products compute it (packed rows and the causal mask included); recomputation (remat) is not
model work and is not counted."""

from __future__ import annotations

from transformer_jax.config.model import GATED_ACTIVATIONS, ModelConfig


def _kv_width(m: ModelConfig) -> int:
  return (m.num_kv_heads or m.num_heads) * m.head_dim


def _ffn(m: ModelConfig) -> int:
  """FLOPs of the feed-forward per token."""
  matrices = 3 if m.ffn_activation in GATED_ACTIVATIONS else 2
  return 2 * matrices * m.d_model * m.d_ff


def _self_attention(m: ModelConfig, length: int) -> int:
  """FLOPs per token of self-attention over rows of `length`: Q, K, V and output
  projections, scores Q K^T and the weighted sum of V."""
  d = m.d_model
  return 2 * (2 * d * d + 2 * d * _kv_width(m)) + 2 * 2 * length * d


def encoder_token(m: ModelConfig, source_length: int) -> int:
  return m.num_encoder_layers * (_self_attention(m, source_length) + _ffn(m))


def decoder_token(m: ModelConfig, source_length: int, target_length: int) -> int:
  """Per target token: masked self-attention, the queries and output of encoder-decoder
  attention with its scores over the source, and the feed-forward; then the output layer."""
  d = m.d_model
  cross = 2 * 2 * d * d + 2 * 2 * source_length * d
  return (m.num_decoder_layers * (_self_attention(m, target_length) + cross + _ffn(m))
          + 2 * d * m.vocab_size)


def cross_keys_values(m: ModelConfig) -> int:
  """Per source token: the keys and values of encoder-decoder attention, in every decoder
  layer."""
  return m.num_decoder_layers * 2 * 2 * m.d_model * _kv_width(m)


def forward(m: ModelConfig, rows: int, source_length: int, target_length: int) -> int:
  """The forward pass over `rows` pairs of rows (teacher forcing)."""
  per_source = encoder_token(m, source_length) + cross_keys_values(m)
  per_target = decoder_token(m, source_length, target_length)
  return rows * (source_length * per_source + target_length * per_target)


def train_step(m: ModelConfig, rows: int, source_length: int, target_length: int) -> int:
  """Forward and backward (the backward pass: twice the forward's products)."""
  return 3 * forward(m, rows, source_length, target_length)


def decoder_step(m: ModelConfig, hypotheses: int, source_length: int, cache_length: int) -> int:
  """One step of cached decoding for `hypotheses` rows: each new token attends to
  `cache_length` cached positions and to the source."""
  return hypotheses * decoder_token(m, source_length, cache_length)
