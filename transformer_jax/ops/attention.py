"""Scaled dot-product attention with its softmax evaluated once: the probabilities are written
in the compute dtype in the forward pass and read, not recomputed, by the backward pass.

Differentiated by JAX, the softmax's f32 scores are kept and every product that reads the
probabilities (the forward's P V, and the backward's dV, dP and the softmax's own gradient)
recomputes them from the scores in its fusion: on a TPU that elementwise work on the (rows,
heads, T, S) scores, not the matrix units or memory, is what the compiler prices a short-row
attention block at (BENCHMARKS.md, "The TPU memory wall"). Here the backward reads the bf16
probabilities once each for dV and for dS = P (dP - rowsum(dO O)), which the dP product's
output can be fused with, and dQ and dK read dS.

The numbers are those of softmax(Q K^T / sqrt(d_k) + bias) V with the probabilities rounded
to the compute dtype before their product with V (as jax.nn.dot_product_attention's XLA
implementation rounds them); tested against it and its gradients (tests/unit/ops).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.ops.masking import NEG_INF


def _scores(q_BTHK, k_BSHK, mask_BHTS, bias_BHTS, dtype):
  scale = 1.0 / math.sqrt(q_BTHK.shape[-1])
  scores_BHTS = jnp.einsum("bthk,bshk->bhts", (q_BTHK * scale).astype(dtype),
                           k_BSHK.astype(dtype), preferred_element_type=jnp.float32)
  if bias_BHTS is not None:
    scores_BHTS = scores_BHTS + bias_BHTS
  return jnp.where(mask_BHTS, scores_BHTS, NEG_INF)


def _forward(q_BTHK, k_BSHK, v_BSHK, mask_BHTS, bias_BHTS, dtype):
  probs_BHTS = jax.nn.softmax(_scores(q_BTHK, k_BSHK, mask_BHTS, bias_BHTS, dtype),
                              axis=-1).astype(dtype)
  out_BTHK = jnp.einsum("bhts,bshk->bthk", probs_BHTS, v_BSHK.astype(dtype),
                        preferred_element_type=jnp.float32)
  return out_BTHK, probs_BHTS


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def softmax_once_attention(q_BTHK, k_BSHK, v_BSHK, mask_BHTS, bias_BHTS, dtype):
  """softmax(Q K^T / sqrt(d_k) + bias) V over each head, in f32, for (B, T, H, K) queries,
  (B, S, H, K) keys and values (as many heads as the queries), a boolean mask broadcasting
  to (B, H, T, S) and an optional differentiable bias (B, H, T, S) (None: none); matmul
  inputs in `dtype`. Differentiable in the queries, keys, values and bias."""
  return _forward(q_BTHK, k_BSHK, v_BSHK, mask_BHTS, bias_BHTS, dtype)[0]


def _attention_fwd(q_BTHK, k_BSHK, v_BSHK, mask_BHTS, bias_BHTS, dtype):
  out_BTHK, probs_BHTS = _forward(q_BTHK, k_BSHK, v_BSHK, mask_BHTS, bias_BHTS, dtype)
  # (the mask and the bias are not read by the backward pass: zero-size stand-ins carry the
  # mask's shape and the bias's dtype, as large as nothing)
  mask_like = jnp.zeros(mask_BHTS.shape + (0,), bool)
  bias_like = None if bias_BHTS is None else jnp.zeros((0,), bias_BHTS.dtype)
  return out_BTHK, (q_BTHK, k_BSHK, v_BSHK, mask_like, bias_like, probs_BHTS, out_BTHK)


def _attention_bwd(dtype, residuals, d_out_BTHK):
  q_BTHK, k_BSHK, v_BSHK, mask_like, bias_like, probs_BHTS, out_BTHK = residuals
  scale = 1.0 / math.sqrt(q_BTHK.shape[-1])
  d_out = d_out_BTHK.astype(dtype)
  d_v_BSHK = jnp.einsum("bhts,bthk->bshk", probs_BHTS, d_out,
                        preferred_element_type=jnp.float32)
  d_probs_BHTS = jnp.einsum("bthk,bshk->bhts", d_out, v_BSHK.astype(dtype),
                            preferred_element_type=jnp.float32)
  # rowsum(P * dP) = dO . O for each query: from the (B, T, H, K) arrays, not the scores
  row_BHT = jnp.einsum("bthk,bthk->bht", d_out_BTHK.astype(jnp.float32), out_BTHK)
  d_scores_BHTS = probs_BHTS.astype(jnp.float32) * (d_probs_BHTS - row_BHT[..., None])
  d_scores = d_scores_BHTS.astype(dtype)
  d_q_BTHK = scale * jnp.einsum("bhts,bshk->bthk", d_scores, k_BSHK.astype(dtype),
                                preferred_element_type=jnp.float32)
  d_k_BSHK = jnp.einsum("bhts,bthk->bshk", d_scores, (q_BTHK * scale).astype(dtype),
                        preferred_element_type=jnp.float32)
  d_bias = None if bias_like is None else d_scores_BHTS.astype(bias_like.dtype)
  d_mask = np.zeros(mask_like.shape[:-1], jax.dtypes.float0)
  return (d_q_BTHK.astype(q_BTHK.dtype), d_k_BSHK.astype(k_BSHK.dtype),
          d_v_BSHK.astype(v_BSHK.dtype), d_mask, d_bias)


softmax_once_attention.defvjp(_attention_fwd, _attention_bwd)
