"""What the benchmark scripts measure alike: the matmul peak of the device, the analytic model
FLOPs of a training step, and peak memory."""

import resource
import time

import jax
import jax.numpy as jnp
import numpy as np

from transformer_jax.aot import flops


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
  """Analytic training FLOPs of one step (transformer_jax.aot.flops: 3x the forward's,
  every position of the (rows, length) batch counted)."""
  return flops.train_step(cfg.model, rows, src_len, tgt_len)


def peak_memory_gb() -> float:
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:  # accelerators
    return stats["peak_bytes_in_use"] / 2 ** 30
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # host RSS (KiB -> GiB)


def packed_batch(rows, length, vocab, rng):
  ids = rng.integers(3, vocab, (rows, length)).astype(np.int32)
  seg = np.zeros((rows, length), np.int32)
  pos = np.zeros((rows, length), np.int32)
  fill = int(0.85 * length)
  for r in range(rows):
    t, s = 0, 1
    while t < fill:
      n = min(int(rng.integers(8, 26)), fill - t)
      seg[r, t:t + n], pos[r, t:t + n] = s, np.arange(n)
      t, s = t + n, s + 1
  ids = ids * (seg > 0)
  return {"inputs": ids, "targets": ids.copy(), "inputs_positions": pos,
          "targets_positions": pos, "inputs_segment_ids": seg, "targets_segment_ids": seg}
