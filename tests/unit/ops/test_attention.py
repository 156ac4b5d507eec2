"""Attention with its softmax evaluated once: values and gradients against JAX's own
differentiation of the same formula (f32), and against jax.nn.dot_product_attention's XLA
implementation (bf16, where both round the probabilities)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.ops.attention import softmax_once_attention
from transformer_jax.ops.masking import NEG_INF

B, T, S, H, K = 2, 5, 7, 3, 4


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.float32)
             for shape in ((B, T, H, K), (B, S, H, K), (B, S, H, K)))
  bias = jnp.asarray(rng.normal(size=(B, H, T, S)), jnp.float32)
  mask = np.tril(np.ones((T, S), bool), k=2)[None, None] & (np.arange(S) < [[6], [4]])[:, None,
                                                                                    None, :]
  weights = jnp.asarray(rng.normal(size=(B, T, H, K)), jnp.float32)
  return q, k, v, jnp.asarray(mask), bias, weights


def _reference(q, k, v, mask, bias):  # the formula, differentiated by JAX
  scores = jnp.einsum("bthk,bshk->bhts", q / np.sqrt(K), k) + bias
  probs = jax.nn.softmax(jnp.where(mask, scores, NEG_INF), axis=-1)
  return jnp.einsum("bhts,bshk->bthk", probs, v)


def _value_and_grads(attention, q, k, v, mask, bias, weights):
  def loss(q, k, v, bias):
    return jnp.sum(attention(q, k, v, mask, bias) * weights)
  return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(q, k, v, bias)


def test_values_and_gradients_match_the_formula_in_f32():
  q, k, v, mask, bias, weights = _inputs()
  once = _value_and_grads(lambda *a: softmax_once_attention(*a, jnp.float32),
                          q, k, v, mask, bias, weights)
  expected = _value_and_grads(_reference, q, k, v, mask, bias, weights)
  np.testing.assert_allclose(once[0], expected[0], rtol=1e-5)
  for name, got, want in zip("qkvb", once[1], expected[1]):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)
  # the masked keys get no gradient (their probabilities are 0)
  assert float(jnp.abs(once[1][1][1, 4:]).max()) == 0.0


def test_no_bias_and_shared_mask():
  q, k, v, mask, _, weights = _inputs(1)
  causal = jnp.asarray(np.tril(np.ones((T, S), bool))[None, None])
  once = _value_and_grads(lambda q, k, v, m, b: softmax_once_attention(q, k, v, m, None,
                                                                       jnp.float32),
                          q, k, v, causal, None, weights)
  expected = _value_and_grads(lambda q, k, v, m, b: _reference(q, k, v, m, 0.0),
                              q, k, v, causal, None, weights)
  np.testing.assert_allclose(once[0], expected[0], rtol=1e-5)
  for got, want in zip(once[1][:3], expected[1][:3]):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_bf16_matches_jax_dot_product_attention():
  q, k, v, mask, _, weights = _inputs(2)
  once = _value_and_grads(lambda q, k, v, m, b: softmax_once_attention(
      q, k, v, m, None, jnp.bfloat16), q, k, v, mask, None, weights)
  xla = _value_and_grads(lambda q, k, v, m, b: jax.nn.dot_product_attention(
      q.astype(jnp.bfloat16), k.astype(jnp.bfloat16), v.astype(jnp.bfloat16),
      mask=jnp.broadcast_to(m, (B, 1, T, S)), implementation="xla").astype(jnp.float32),
      q, k, v, mask, None, weights)
  assert float(once[0]) == pytest.approx(float(xla[0]), rel=2e-2)
  for got, want in zip(once[1][:3], xla[1][:3]):
    scale = float(jnp.abs(want).max())
    assert float(jnp.abs(got - want).max()) < 0.03 * scale
