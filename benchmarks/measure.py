"""What the benchmark scripts measure alike: the matmul peak of the device, the analytic model
FLOPs of a training step, and peak memory."""

import resource
import time

import jax
import jax.numpy as jnp


def matmul_peak(dtype, n=2048, reps=10) -> float:
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
  f(a, a).block_until_ready()
  t = time.perf_counter()
  for _ in range(reps):
    out = f(a, a)
  out.block_until_ready()
  return 2 * n ** 3 * reps / (time.perf_counter() - t)


def model_flops_per_step(cfg, rows: int, src_len: int, tgt_len: int) -> float:
  """Analytic training FLOPs of one step (3x the forward's: forward, and backward for
  activations and weights), counting every position of the (rows, length) batch: the
  projections, feed-forward blocks, attention scores and mixing, and the output softmax."""
  m = cfg.model
  D, F, V = m.d_model, m.d_ff, m.vocab_size
  kv = 2 * D * m.kv_heads * m.head_dim  # the K and V projections (fewer heads: smaller)
  ffn = (3 if m.ffn_activation in ("swiglu", "geglu") else 2) * D * F  # (gated: 3 matrices)
  enc_layer = 2 * D * D + kv + ffn + 2 * src_len * D               # per source position
  dec_layer = 4 * D * D + kv + ffn + 2 * tgt_len * D + 2 * src_len * D  # per target position
  cross_kv = kv                                                    # per source position
  macs = rows * (src_len * m.num_encoder_layers * (enc_layer + cross_kv)
                 + tgt_len * (m.num_decoder_layers * dec_layer + D * V))
  return 3 * 2 * macs


def peak_memory_gb() -> float:
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:  # accelerators
    return stats["peak_bytes_in_use"] / 2 ** 30
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # host RSS (KiB -> GiB)
