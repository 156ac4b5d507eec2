"""Label-smoothed cross-entropy against its formula, and the fused, chunked softmax layer +
loss against the plain logits -> cross_entropy path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.ops import losses


def test_label_smoothed_cross_entropy_matches_naive_formula():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 7)).astype(np.float32)
  targets = np.array([[1, 4, 0], [6, 2, 3]])
  weights = targets > 0
  ls = 0.1
  loss, nll, n = losses.cross_entropy(jnp.asarray(logits), jnp.asarray(targets),
                                         jnp.asarray(weights), ls)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  soft = np.full((2, 3, 7), ls / 6)
  np.put_along_axis(soft, targets[..., None], 1 - ls, axis=-1)
  entropy = -(soft[0, 0] * np.log(soft[0, 0])).sum()
  expect_loss = ((-(soft * logp).sum(-1) - entropy) * weights).sum()
  expect_nll = (-np.take_along_axis(logp, targets[..., None], -1)[..., 0] * weights).sum()
  assert float(n) == 5
  assert float(loss) == pytest.approx(expect_loss, rel=1e-5)
  assert float(nll) == pytest.approx(expect_nll, rel=1e-5)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
# 2 chunks of 256; one chunk (no divisor >= 64); one chunk of odd length (not split in two)
@pytest.mark.parametrize("n", [512, 96, 95])
def test_fused_output_loss_matches_the_plain_path(label_smoothing, n):
  rng = np.random.default_rng(0)
  D, V = 16, 50
  h = jnp.asarray(rng.normal(size=(n, D)), jnp.float32)
  table = jnp.asarray(rng.normal(size=(V, D)) * 0.3, jnp.float32)
  targets = jnp.asarray(rng.integers(1, V, n), jnp.int32)
  weights = jnp.asarray(rng.random(n) > 0.2, jnp.float32)  # some padding

  def plain(h, table):
    sums = losses.cross_entropy(h @ table.T, targets, weights, label_smoothing)
    return sums[0], sums

  def fused(h, table):
    sums = losses.output_loss(h, table, targets, weights, label_smoothing, jnp.float32)
    return sums[0], sums

  (g_plain, s_plain) = jax.grad(plain, argnums=(0, 1), has_aux=True)(h, table)
  (g_fused, s_fused) = jax.grad(fused, argnums=(0, 1), has_aux=True)(h, table)
  np.testing.assert_allclose(s_fused, s_plain, rtol=1e-5)
  for a, b in zip(g_fused, g_plain):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
  assert float(s_fused[2]) == float(weights.sum())


def test_bfloat16_fused_loss_is_close_to_float32():
  """bf16 matmuls with f32 accumulation (the table gradient contracts the tokens in two
  axes, which keeps XLA:CPU's bf16 kernel): gradients within bf16 rounding of f32."""
  rng = np.random.default_rng(1)
  n, D, V = 512, 32, 300
  h = jnp.asarray(rng.normal(size=(n, D)), jnp.float32)
  table = jnp.asarray(rng.normal(size=(V, D)) * 0.3, jnp.float32)
  targets = jnp.asarray(rng.integers(1, V, n), jnp.int32)
  weights = jnp.ones((n,), jnp.float32)
  grads = {dtype: jax.grad(lambda h, t: losses.output_loss(h, t, targets, weights, 0.1,
                                                               dtype)[0], argnums=(0, 1))(h, table)
           for dtype in (jnp.float32, jnp.bfloat16)}
  for g16, g32 in zip(grads[jnp.bfloat16], grads[jnp.float32]):
    assert g16.dtype == jnp.float32
    err = float(jnp.linalg.norm(g16 - g32) / jnp.linalg.norm(g32))
    assert err < 0.02, err


def test_bf16_logits_match_the_plain_path_within_their_rounding():
  """With bf16 logits (TPUs' auto) the fused loss, each token's NLL (its target's logit now
  computed from its own table row) and the gradients are the plain path's within the
  rounding of logits to bf16. (XLA:CPU may keep the logits' f32 bits where it fuses their
  conversions, so the TPU's exact rounding cannot be asserted here.)"""
  rng = np.random.default_rng(2)
  n, D, V = 384, 32, 300
  h = jnp.asarray(rng.normal(size=(n, D)), jnp.float32)
  table = jnp.asarray(rng.normal(size=(V, D)) * 0.3, jnp.float32)
  targets = jnp.asarray(rng.integers(1, V, n), jnp.int32)
  weights = jnp.asarray(rng.random(n) > 0.2, jnp.float32)

  def plain(h, table, weights=weights):
    logits = jnp.einsum("cd,vd->cv", h.astype(jnp.bfloat16), table.astype(jnp.bfloat16),
                        preferred_element_type=jnp.float32)
    return losses.cross_entropy(logits, targets, weights, 0.1)

  def fused(h, table, weights=weights):
    return losses.output_loss(h, table, targets, weights, 0.1, jnp.bfloat16, 128,
                              jnp.bfloat16)

  np.testing.assert_allclose(fused(h, table), plain(h, table), rtol=1e-3)
  # the logits matmul writes bf16 (and only with bf16 logits asked for)
  for logits, written in ((jnp.bfloat16, "bfloat16"), (jnp.float32, "float32")):
    jaxpr = str(jax.make_jaxpr(lambda h, t, logits=logits: losses.output_loss(
        h, t, targets, weights, 0.1, jnp.bfloat16, 128, logits))(h, table))
    assert f"preferred_element_type={written}" in jaxpr
    assert (logits == jnp.float32) == ("preferred_element_type=bfloat16" not in jaxpr)
  # token by token (a weight of 1 on one token): logits of |x| < 4 are within 2^-7 in bf16
  one_token = jnp.eye(n, dtype=jnp.float32)[:32]
  per_token = [jax.vmap(lambda w, path=path: path(h, table, w)[1])(one_token)
               for path in (fused, plain)]
  np.testing.assert_allclose(per_token[0], per_token[1], atol=2 * 2.0**-7)
  got = jax.grad(lambda h, t: fused(h, t)[0], argnums=(0, 1))(h, table)
  want = jax.grad(lambda h, t: plain(h, t)[0], argnums=(0, 1))(h, table)
  for g, w in zip(got, want):
    err = float(jnp.linalg.norm(g - w) / jnp.linalg.norm(w))
    assert err < 0.01, err


def test_bf16_logits_are_auto_on_tpus_only_and_need_bf16_matmuls():
  bf16, f32 = jnp.bfloat16, jnp.float32
  assert [losses.logits_dtype_for("auto", bf16, p) for p in ("tpu", "gpu", "cpu")] == [
      bf16, f32, f32]
  assert losses.logits_dtype_for("bfloat16", bf16, "cpu") == bf16
  assert losses.logits_dtype_for("bfloat16", f32, "tpu") == f32
  assert losses.logits_dtype_for("float32", bf16, "tpu") == f32


def test_the_loss_tile_is_the_configured_one_on_cpu_and_at_least_8192_tokens_elsewhere():
  V = 32000
  assert [losses.tile_for("cpu", t, V) for t in (256, 0, 20000)] == [256, 0, 20000]
  assert [losses.tile_for(p, 256, V) for p in ("tpu", "gpu")] == [8192] * 2
  assert (losses.tile_for("tpu", 0, V), losses.tile_for("tpu", 20000, V)) == (0, 20000)
  assert losses.tile_for("tpu", 256, 256000) == 1048  # (1 GiB of f32 logits at most)
  # what the loop then runs: one tile up to the tile's size, whatever n's factors
  assert [losses._num_chunks(n, losses.tile_for("tpu", 256, V)) for n in (768, 6144, 8192,
                                                                           16384)] == [1, 1, 1, 2]
  assert [losses._num_chunks(n, 256) for n in (128, 512, 8192)] == [1, 2, 32]
