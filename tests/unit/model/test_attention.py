"""Scaled dot-product attention and multi-head attention against plain-numpy references."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tests import helpers
from transformer_jax.model.attention import MultiHeadAttention, scaled_dot_product_attention

CFG = helpers.section("model", vocab_size=40, d_model=32, num_heads=4, d_ff=64,
                      num_encoder_layers=2, num_decoder_layers=2, dropout_rate=0.0, max_len=32)


def test_scaled_dot_product_attention_matches_naive_loops():
  rng = np.random.default_rng(0)
  B, T, S, H, K = 2, 3, 4, 2, 5
  q, k, v = (rng.normal(size=s).astype(np.float32) for s in [(B, T, H, K), (B, S, H, K),
                                                               (B, S, H, K)])
  mask = rng.random((B, 1, T, S)) > 0.3
  mask[..., 0] = True  # every query sees at least one key
  out, weights = scaled_dot_product_attention(q, k, v, jnp.asarray(mask), jnp.float32)
  for b in range(B):
    for h in range(H):
      for t in range(T):
        scores = np.array([q[b, t, h] @ k[b, s, h] / math.sqrt(K) for s in range(S)])
        scores = np.where(mask[b, 0, t], scores, -np.inf)
        p = np.exp(scores - scores.max())
        p /= p.sum()
        np.testing.assert_allclose(np.asarray(weights[b, h, t]), p, atol=1e-6)
        np.testing.assert_allclose(np.asarray(out[b, t, h]), p @ v[b, :, h], atol=1e-5)
  # Masked cells get exactly zero weight.
  assert np.all(np.asarray(weights)[~np.broadcast_to(mask, weights.shape)] == 0.0)


def test_multi_head_attention_splits_projects_and_merges_heads():
  """The module equals: project to Q, K, V; split into heads; attend per head; concatenate;
  output projection — written out with plain matrices."""
  mha = MultiHeadAttention(CFG)
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, CFG.d_model))
  mask = jnp.ones((2, 1, 5, 5), bool)
  params = nn.meta.unbox(mha.init(jax.random.PRNGKey(2), x, x, mask, True)["params"])
  out = mha.apply({"params": params}, x, x, mask, True)
  D, H, K = CFG.d_model, CFG.num_heads, CFG.head_dim
  proj = {n: (np.asarray(params[n]["kernel"]).reshape(D, D), np.asarray(params[n]["bias"])
              .reshape(D)) for n in ("query", "key", "value")}
  xn = np.asarray(x)
  q, k, v = (xn @ proj[n][0] + proj[n][1] for n in ("query", "key", "value"))
  heads = []
  for h in range(H):
    sl = slice(h * K, (h + 1) * K)
    s = q[..., sl] @ np.swapaxes(k[..., sl], -1, -2) / math.sqrt(K)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    heads.append(p @ v[..., sl])
  merged = np.concatenate(heads, -1)
  wo = np.asarray(params["output"]["kernel"]).reshape(D, D)
  expected = merged @ wo + np.asarray(params["output"]["bias"])
  np.testing.assert_allclose(np.asarray(out), expected, atol=1e-4)
