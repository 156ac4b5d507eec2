"""Whether the installed jaxlib rewrites a whole buffer at each small in-loop write (jax issue
#40101: since jaxlib 0.11.1, XLA:CPU's dynamic-update-slice of under ~256-480 bytes inside a
loop body costs O(buffer) per iteration), and what it would cost our decoding.

  python benchmarks/dus_regression.py

The pins (pyproject.toml) admit 0.11 and 0.12, and a decoding engine on a CPU with jaxlib
>= 0.11.1 says once to run this (decoding.engine.note_loop_write_regression). Three
timings, each a compiled loop of `--steps` iterations (second call, compile excluded):
  reproducer   the issue's idiom: a 200,000-float buffer, `.at[t + 1].set()` each step
  scalar       the same loop carrying a scalar only (the loop's own cost)
  tokens       greedy decoding's token buffer as it is written: (rows, capacity) int32,
               one (rows, 1) column per step (rows * 4 bytes: under the threshold)
  cache        a self-attention cache write: (rows, heads, capacity, head_dim) bf16, one
               (rows, heads, 1, head_dim) slice per step (the default model's shapes)
A jaxlib with the regression shows `reproducer` thousands of times `scalar`; without it, a
few times at most. The per-step cost of `tokens` and `cache` is what each decoding step pays
for those writes, to set beside a step of the model (milliseconds on 2 CPU cores).
"""

import time

import jax
import jax.numpy as jnp
from absl import app, flags

import transformer_jax  # noqa: F401  (its import leaves an absent TPU out: a quiet start)

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 2000, "Iterations of each loop.")
flags.DEFINE_integer("rows", 8, "Rows of the decoding buffers (sentences x beams).")
flags.DEFINE_integer("capacity", 128, "Positions of the decoding buffers.")


def _seconds(fn, *args) -> float:
  jax.block_until_ready(fn(*args))  # (compiles)
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def main(_):
  steps, rows, capacity = FLAGS.steps, FLAGS.rows, FLAGS.capacity

  @jax.jit
  def reproducer(x):
    return jax.lax.fori_loop(0, steps, lambda t, x: x.at[t + 1].set(x[t] * 0.5 + 1.0), x)

  @jax.jit
  def scalar(x):
    return jax.lax.fori_loop(0, steps, lambda t, x: x * 0.5 + 1.0, x)

  @jax.jit
  def tokens(buffer):
    def write(t, b):
      column = jnp.full((rows, 1), t, jnp.int32)
      return jax.lax.dynamic_update_slice(b, column, (0, t % capacity))
    return jax.lax.fori_loop(0, steps, write, buffer)

  @jax.jit
  def cache(buffer):
    def write(t, b):
      kv = jnp.full((rows, 4, 1, 64), t, jnp.bfloat16)
      return jax.lax.dynamic_update_slice(b, kv, (0, 0, t % capacity, 0))
    return jax.lax.fori_loop(0, steps, write, buffer)

  timings = {
      "reproducer": _seconds(reproducer, jnp.zeros((200_000,), jnp.float32)),
      "scalar": _seconds(scalar, jnp.float32(0.0)),
      "tokens": _seconds(tokens, jnp.zeros((rows, capacity), jnp.int32)),
      "cache": _seconds(cache, jnp.zeros((rows, 4, capacity, 64), jnp.bfloat16)),
  }
  print(f"jax {jax.__version__}, jaxlib {jax.lib.__version__}, {jax.devices()[0].device_kind}; "
        f"{steps} steps; buffers: tokens ({rows}, {capacity}) int32, cache ({rows}, 4, "
        f"{capacity}, 64) bf16")
  for name, seconds in timings.items():
    print(f"  {name:<10} {seconds * 1e3:9.2f} ms  ({seconds / steps * 1e6:8.3f} us/step)")
  ratio = timings["reproducer"] / timings["scalar"]
  verdict = "PRESENT" if ratio > 100 else "absent"
  print(f"reproducer / scalar: {ratio:.1f}x -> the regression of jax #40101 is {verdict}")


if __name__ == "__main__":
  app.run(main)
