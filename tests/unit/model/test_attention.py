"""Scaled dot-product attention and multi-head attention against plain-numpy references; the
fused path (jax.nn.dot_product_attention) against the einsum path."""

import dataclasses
import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import helpers
from transformer_jax.model.attention import (
  MultiHeadAttention,
  attention_implementation,
  causal_mask,
  fused_attention,
  padding_mask,
  scaled_dot_product_attention,
  segment_mask,
  write_slots,
)
from transformer_jax.model.transformer import Transformer, apply_to_batch

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


def test_grouped_query_attention_shares_each_key_value_head_among_its_query_heads():
  """num_kv_heads = G: the module equals multi-head attention whose key/value heads are the G
  heads repeated (query head h reads head h // (H/G)); G = H is the paper's attention."""
  x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, CFG.d_model))
  mask = jnp.ones((2, 1, 5, 5), bool)
  gqa = MultiHeadAttention(dataclasses.replace(CFG, num_kv_heads=2))
  params = nn.meta.unbox(gqa.init(jax.random.PRNGKey(2), x, x, mask, True)["params"])
  assert params["key"]["kernel"].shape == (CFG.d_model, 2, CFG.head_dim)
  repeated = dict(params)
  for name in ("key", "value"):
    repeated[name] = {k: np.repeat(np.asarray(v), 2, axis=-2) for k, v in params[name].items()}
  mha = MultiHeadAttention(CFG)
  np.testing.assert_allclose(np.asarray(gqa.apply({"params": params}, x, x, mask, True)),
                             np.asarray(mha.apply({"params": repeated}, x, x, mask, True)),
                             atol=1e-6)
  same = MultiHeadAttention(dataclasses.replace(CFG, num_kv_heads=CFG.num_heads))
  np.testing.assert_array_equal(np.asarray(same.apply({"params": repeated}, x, x, mask, True)),
                                np.asarray(mha.apply({"params": repeated}, x, x, mask, True)))


def _masks(rng, B, T, S):
  """Padding, causal and packed-segment masks as the model builds them, (B, 1, T, S)."""
  q_tokens = np.ones((B, T), np.int32)
  q_tokens[0, T - 2:] = 0  # padded queries (their rows see nothing)
  k_tokens = np.ones((B, S), np.int32)
  k_tokens[1, S - 3:] = 0
  segments = np.repeat(np.array([[1, 1, 1, 2, 2, 2, 3, 3]]), B, axis=0)[:, :T]
  return {"padding": padding_mask(q_tokens, k_tokens),
          "causal": padding_mask(q_tokens, q_tokens[:, :T]) & causal_mask(T),
          "packed": padding_mask(q_tokens, q_tokens) & causal_mask(T)
          & segment_mask(segments, segments)}


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
@pytest.mark.parametrize("mask_kind", ["padding", "causal", "packed"])
def test_fused_attention_equals_the_einsum_path_in_values_and_gradients(mask_kind, dtype, tol):
  """jax.nn.dot_product_attention (XLA's implementation here, cuDNN's on GPUs) computes what
  our einsum products do, with every mask the model uses, gradients included."""
  rng = np.random.default_rng(1)
  B, T, H, K = 2, 8, 2, 8
  S = T if mask_kind != "padding" else 6
  mask = jnp.asarray(_masks(rng, B, T, S)[mask_kind])
  q, k, v = (jnp.asarray(rng.normal(size=s), jnp.float32)
             for s in [(B, T, H, K), (B, S, H, K), (B, S, H, K)])
  cot = jnp.asarray(rng.normal(size=(B, T, H, K)), jnp.float32)

  def einsum_path(q, k, v):
    return jnp.sum(scaled_dot_product_attention(q, k, v, mask, dtype)[0] * cot)

  def fused_path(q, k, v):
    return jnp.sum(fused_attention(q, k, v, mask, dtype, "xla") * cot)
  value_e, grads_e = jax.value_and_grad(einsum_path, argnums=(0, 1, 2))(q, k, v)
  value_f, grads_f = jax.value_and_grad(fused_path, argnums=(0, 1, 2))(q, k, v)
  scale = float(jnp.abs(value_e)) + 1.0
  assert abs(float(value_e) - float(value_f)) <= tol * scale
  for ge, gf in zip(grads_e, grads_f):
    assert np.all(np.isfinite(np.asarray(gf)))
    np.testing.assert_allclose(np.asarray(gf), np.asarray(ge), atol=tol * 2, rtol=tol)


@pytest.mark.parametrize("variant", [{}, {"num_kv_heads": 2, "positional_encoding": "relative"}],
                         ids=["paper", "gqa-relative"])
def test_the_model_with_fused_attention_equals_the_einsum_model_and_auto_is_einsum_on_cpu(
    variant):
  cfg = dataclasses.replace(CFG, dropout_rate=0.0, **variant)
  batch = helpers.fixed_batch(rows=4, length=12, vocab=40)
  impls = ("einsum", "xla", "softmax_once")
  models = {impl: Transformer(dataclasses.replace(cfg, attention_impl=impl)) for impl in impls}
  params = models["einsum"].init(jax.random.PRNGKey(0), batch["inputs"][:1],
                                 batch["targets"][:1])["params"]

  def loss(model, params):
    logits = apply_to_batch(model, params, batch, False, {})
    return jnp.mean(jax.nn.log_softmax(logits) * (batch["targets"] > 0)[..., None])
  (l_e, g_e), *others = (jax.value_and_grad(functools.partial(loss, models[i]))(params)
                         for i in impls)
  for l_x, g_x in others:
    np.testing.assert_allclose(float(l_x), float(l_e), rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(g_x), jax.tree_util.tree_leaves(g_e)):
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-4)
  auto = dataclasses.replace(cfg, attention_impl="auto")
  assert attention_implementation(auto) == "einsum"
  # (the TPU compiler predicts it faster than XLA's, and that faster than einsum)
  assert attention_implementation(auto, "tpu") == "softmax_once"
  assert attention_implementation(dataclasses.replace(cfg, attention_impl="xla")) == "xla"


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_a_cache_write_replaces_exactly_each_row_s_slots_16_bit_ones_as_integers(dtype):
  """Each row's W new slots land at its own first .. first + W - 1 (rows decode at steps of
  their own) and nothing else moves; a 16-bit cache is selected over as integers, the same
  bits (XLA:CPU would run a 16-bit-float select through f32 over the whole cache)."""
  rng = np.random.default_rng(0)
  cache = jnp.asarray(rng.normal(size=(3, 2, 4 * 5, 8)), dtype)
  new = jnp.asarray(rng.normal(size=(3, 2, 4, 8)), dtype)
  for first in ([0, 8, 16], [16, 0, 4], [4, 4, 4]):
    expected = np.asarray(cache).copy()
    for row, at in enumerate(first):
      expected[row, :, at:at + 4] = np.asarray(new)[row]
    written = jax.jit(write_slots)(cache, new, jnp.asarray(first))
    np.testing.assert_array_equal(written, expected)
  jaxpr = str(jax.make_jaxpr(write_slots)(cache, new, jnp.asarray([0, 8, 16])))
  assert ("bitcast_convert_type" in jaxpr) == (dtype == jnp.bfloat16)
