"""A program traced for other devices takes their choices, not this CPU's."""

import dataclasses

import jax
import jax.numpy as jnp

from tests.helpers import section
from transformer_jax.model.attention import attention_implementation
from transformer_jax.ops import matmul, platform


def _backward(spec, a, b) -> str:
  """The backward pass of `matmul.matmul` in f32, as a jaxpr's text."""
  def loss(a, b):
    return jnp.sum(matmul.matmul(spec, a, b, jnp.float32))
  return str(jax.make_jaxpr(jax.grad(loss, argnums=1))(a, b))


def test_a_program_traced_for_a_tpu_takes_the_tpus_choices():
  auto = dataclasses.replace(section("model"), attention_impl="auto")
  a, b = jnp.ones((4, 8, 32)), jnp.ones((32, 16))  # (d > f: XLA:CPU puts the cotangent first)
  on_cpu = _backward("btd,df->btf", a, b)
  with platform.tracing_for("tpu"):
    assert platform.traced_for() == "tpu"
    assert attention_implementation(auto) == "softmax_once"
    on_tpu = _backward("btd,df->btf", a, b)
  assert platform.traced_for() == jax.default_backend() == "cpu"
  assert attention_implementation(auto) == "einsum"
  assert on_cpu != on_tpu  # (XLA:CPU's weight-gradient layout is not a TPU's)
