"""The matmul's own backward rule computes what jax.grad of einsum computes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.ops import matmul as matmul_module
from transformer_jax.ops.matmul import matmul


@pytest.mark.parametrize("spec, a_shape, b_shape", [
    ("...a,abc->...bc", (2, 5, 8), (8, 2, 4)),     # split heads
    ("...ab,abc->...c", (2, 5, 2, 4), (2, 4, 8)),  # merge heads
    ("...a,ab->...b", (2, 5, 8), (8, 16)),         # feed-forward
    ("...a,ab->...b", (2, 5, 16), (16, 8)),        # (cotangent smaller than activations)
    ("btd,vd->btv", (2, 5, 8), (32, 8)),           # tied output embedding
])
def test_matmul_gradients_equal_jax_grad_of_einsum_in_f32(spec, a_shape, b_shape):
  """The projections' own VJP (which orders the weight-gradient matmul for XLA:CPU) computes
  the same gradients as jax.grad of a plain einsum: f32 stays the exact reference."""
  rng = np.random.default_rng(0)
  a = jnp.asarray(rng.normal(size=a_shape), jnp.float32)
  b = jnp.asarray(rng.normal(size=b_shape), jnp.float32)
  out_shape = jnp.einsum(spec, a, b).shape
  g = jnp.asarray(rng.normal(size=out_shape), jnp.float32)
  ours = jax.grad(lambda a, b: jnp.sum(matmul(spec, a, b, jnp.float32) * g),
                  argnums=(0, 1))(a, b)
  plain = jax.grad(lambda a, b: jnp.sum(jnp.einsum(spec, a, b) * g), argnums=(0, 1))(a, b)
  for x, y in zip(ours, plain):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)])
def test_off_cpu_the_plain_operand_order_gives_the_same_gradients(monkeypatch, dtype, tol):
  """The CPU operand-order rules apply on CPU only; another backend's plain order computes
  the same gradients (simulated: the backend is reported as "gpu" while tracing)."""
  rng = np.random.default_rng(1)
  spec = "...a,ab->...b"
  a = jnp.asarray(rng.normal(size=(2, 5, 16)), jnp.float32)
  b = jnp.asarray(rng.normal(size=(16, 8)), jnp.float32)
  g = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32)

  def grads():
    return jax.grad(lambda a, b: jnp.sum(matmul(spec, a, b, dtype) * g), argnums=(0, 1))(a, b)
  on_cpu = grads()
  monkeypatch.setattr(matmul_module.jax, "default_backend", lambda: "gpu")
  off_cpu = grads()
  for x, y in zip(off_cpu, on_cpu):
    np.testing.assert_allclose(x, y, rtol=tol, atol=tol)
