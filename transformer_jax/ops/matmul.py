"""Matmuls with f32 results and backward rules written for speed: where the model's products
are tuned to the backend (the decoding cache's attention products aside: model.attention).

`matmul` is einsum with f32 accumulation: exact f32, or bf16 inputs (`dtype=jnp.bfloat16`) in
both passes. On CPU its backward pass orders each product for XLA:CPU's kernels: the weight
gradient puts the side with fewer free elements first (`_weight_grad`), and bf16 products
take the operand orders XLA:CPU has bf16 kernels for (`_einsum_bwd`). On other backends the
products keep jax's plain order (the same values; their compilers choose layouts themselves).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from transformer_jax.ops.platform import traced_for


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
  on_cpu = traced_for() == "cpu"  # (the orders are XLA:CPU's; elsewhere: plain)
  if dtype == jnp.float32 and on_cpu:
    db = _weight_grad(spec, a_c, g_c)
  elif b_grad_input_first or not on_cpu:
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
  a_letters, g_letters = lhs.replace("...", ""), out.replace("...", "")
  a_free = [c for c in a_letters if c in rhs]
  g_free = [c for c in g_letters if c in rhs]

  def size(x, letters, free):  # elements along the `free` axes of x (letters: x's axes)
    return math.prod(x.shape[x.ndim - len(letters) + letters.index(c)] for c in free)

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

