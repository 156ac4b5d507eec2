"""Training-step speed of a config: tokens/s, model FLOPs, MFU against the measured matmul peak.

  python benchmarks/train_speed.py [--config=configs/default.py] [--steps=10]

Peak: the best of f32 and bf16-in/f32-accumulate 2048² matmuls measured in the same run.
Batches are synthetic but shaped like the config's packed batches (85% of slots filled with
examples of 8–25 tokens). FLOPs come from XLA's cost analysis of the compiled step.
"""

import functools
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from transformer_jax import config as config_lib, sharding, train_lib  # noqa: E402
from transformer_jax.model import Transformer  # noqa: E402

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/default.py", "Config to measure.")
flags.DEFINE_integer("steps", 10, "Timed steps (after 3 warm-up steps).")


def matmul_peak(dtype, n=2048, reps=10) -> float:
  a = jnp.ones((n, n), dtype)
  f = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
  f(a, a).block_until_ready()
  t = time.perf_counter()
  for _ in range(reps):
    out = f(a, a)
  out.block_until_ready()
  return 2 * n ** 3 * reps / (time.perf_counter() - t)


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


def main(_):
  cfg = config_lib.from_config_dict(FLAGS.config)
  mesh = sharding.make_mesh(cfg.parallelism)
  model = Transformer(cfg.model)
  state, state_sharding = train_lib.create_state(cfg, model, mesh, jax.random.PRNGKey(0))
  batch = packed_batch(cfg.data.batch_size, cfg.data.max_source_length, cfg.model.vocab_size,
                       np.random.default_rng(0))
  real_tokens = int((batch["inputs"] > 0).sum() + (batch["targets"] > 0).sum())
  batch = sharding.global_batch(batch, mesh)
  step = jax.jit(functools.partial(train_lib.train_step, model=model,
                                   label_smoothing=cfg.label_smoothing),
                 in_shardings=(state_sharding, sharding.batch_sharding(mesh),
                               sharding.replicated(mesh)),
                 out_shardings=(state_sharding, sharding.replicated(mesh)), donate_argnums=(0,))
  rng = jax.random.PRNGKey(1)
  t = time.perf_counter()
  compiled = step.lower(state, batch, rng).compile()
  compile_s = time.perf_counter() - t
  cost = compiled.cost_analysis()
  flops = (cost[0] if isinstance(cost, list) else cost)["flops"]
  for _ in range(3):
    state, m = step(state, batch, rng)
  jax.block_until_ready(m)
  t = time.perf_counter()
  for _ in range(FLAGS.steps):
    state, m = step(state, batch, rng)
  jax.block_until_ready(m)
  step_s = (time.perf_counter() - t) / FLAGS.steps
  peak32, peak16 = matmul_peak(jnp.float32), matmul_peak(jnp.bfloat16)
  achieved = flops / step_s
  print(f"machine: {platform.processor() or platform.machine()}, {jax.device_count()} "
        f"{jax.devices()[0].platform} device(s); jax {jax.__version__}")
  print(f"config: d_model {cfg.model.d_model}, layers {cfg.model.num_encoder_layers}+"
        f"{cfg.model.num_decoder_layers}, vocab {cfg.model.vocab_size}, dtype {cfg.model.dtype}, "
        f"batch {cfg.data.batch_size}x{cfg.data.max_source_length}")
  print(f"compile: {compile_s:.1f} s")
  print(f"step: {step_s * 1000:.0f} ms; {real_tokens / step_s:,.0f} real src+tgt tokens/s")
  print(f"model FLOPs/step (XLA): {flops / 1e9:.1f} G; achieved {achieved / 1e9:.0f} GFLOP/s")
  print(f"matmul peak: f32 {peak32 / 1e9:.0f} GFLOP/s, bf16->f32 {peak16 / 1e9:.0f} GFLOP/s")
  print(f"MFU: {100 * achieved / peak32:.0f}% of f32 peak, {100 * achieved / peak16:.0f}% of "
        f"bf16 peak")


if __name__ == "__main__":
  app.run(main)
