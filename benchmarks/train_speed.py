"""Training-step speed: tokens/s, model FLOPs, MFU against the matmul peak of the same machine
measured in the same run, compile time and peak memory; optionally beside the PyTorch peer.

  python benchmarks/train_speed.py [--config=configs/default.py] [--steps=10]
  python benchmarks/train_speed.py --shape=small --dtypes=float32,bfloat16 \
      --torch_python=/path/to/torch-venv/bin/python [--rounds=2]

`--shape=small|base` sets the model and batch to the shapes of ../shared/peers/torch_peer.py
(small: d_model 256, 3+3 layers, 4 heads, FFN 1024, vocab 8000, 64 rows of 32+32 tokens;
base: 512, 6+6, 8, 2048, 32000, 32 rows of 64+64), with every token real, like the peer.
Otherwise batches are synthetic packed rows shaped like the config's (85% of slots filled).
Model FLOPs are counted analytically (`model_flops_per_step`; XLA's own count is printed beside
it, but it counts a loop body once, e.g. the chunked loss); the peaks are 2048² matmuls in f32
and in bf16-in/f32-accumulate. With `--torch_python`, the peer's training runs between our
measurements (alternating, `--rounds` times) and the ratio of medians is printed.
"""

import dataclasses
import functools
import json
import statistics
import subprocess
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from measure import matmul_peak, model_flops_per_step, packed_batch, peak_memory_gb
from ml_collections import config_flags

from transformer_jax.config.parse import from_config_dict
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import hardware, numerics
from transformer_jax.parallel import mesh as sharding
from transformer_jax.training.state import create_state
from transformer_jax.training.step import train_step

ROOT = Path(__file__).resolve().parents[1]

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", "configs/default.py", "Config to measure.")
flags.DEFINE_integer("steps", 10, "Timed steps (after 3 warm-up steps).")
flags.DEFINE_enum("shape", "", ["", "small", "base"], "The PyTorch peer's shapes.")
flags.DEFINE_list("dtypes", [], "Matmul dtypes to measure (default: the config's).")
flags.DEFINE_string("torch_python", "", "Python with torch installed: runs the peer too.")
flags.DEFINE_integer("rounds", 1, "Alternating rounds (ours, peer) per measurement.")

PEER = ROOT.parent / "shared" / "peers" / "torch_peer.py"
SHAPES = {"small": dict(d_model=256, layers=3, heads=4, ffn=1024, vocab=8000, batch=64, len=32),
          "base": dict(d_model=512, layers=6, heads=8, ffn=2048, vocab=32000, batch=32, len=64)}


def full_batch(rows, length, vocab, rng):
  """Unpacked rows with every token real (the peer's batches)."""
  src = rng.integers(3, vocab, (rows, length)).astype(np.int32)
  tgt = rng.integers(3, vocab, (rows, length)).astype(np.int32)
  return {"inputs": src, "targets": tgt}


def configure(config, dtype: str):
  config = from_config_dict(config)
  model_cfg = config.model
  if FLAGS.shape:
    c = SHAPES[FLAGS.shape]
    model_cfg = dataclasses.replace(
        model_cfg, d_model=c["d_model"], num_encoder_layers=c["layers"],
        num_decoder_layers=c["layers"], num_heads=c["heads"], d_ff=c["ffn"],
        vocab_size=c["vocab"], dropout_rate=0.1)
    data_cfg = dataclasses.replace(config.data, batch_size=c["batch"],
                                   max_source_length=c["len"], max_target_length=c["len"])
    config = dataclasses.replace(config, model=model_cfg, data=data_cfg)
  dtype = numerics.resolve(dtype or config.model.dtype).dtype  # ("auto": what training picks)
  config = dataclasses.replace(config, model=dataclasses.replace(config.model, dtype=dtype))
  return config


def measure(cfg) -> dict:
  """Compiles and times the train step of `cfg` on all devices."""
  mesh = sharding.make_mesh(cfg.parallelism)
  model = Transformer(cfg.model)
  state, state_sharding = create_state(cfg, model, mesh, jax.random.PRNGKey(0))
  rng_np = np.random.default_rng(0)
  if FLAGS.shape:
    batch = full_batch(cfg.data.batch_size, cfg.data.max_source_length, cfg.model.vocab_size,
                       rng_np)
  else:
    batch = packed_batch(cfg.data.batch_size, cfg.data.max_source_length,
                         cfg.model.vocab_size, rng_np)
  real_tokens = int((batch["inputs"] > 0).sum() + (batch["targets"] > 0).sum())
  batch = sharding.global_batch(batch, mesh)
  step = jax.jit(functools.partial(train_step, model=model,
                                   label_smoothing=cfg.label_smoothing,
                                   num_micro_batches=cfg.num_micro_batches, mesh=mesh),
                 in_shardings=(state_sharding, sharding.batch_sharding(mesh),
                               sharding.replicated(mesh)),
                 out_shardings=(state_sharding, sharding.replicated(mesh)), donate_argnums=(0,))
  rng = jax.random.PRNGKey(1)
  t = time.perf_counter()
  compiled = step.lower(state, batch, rng).compile()
  compile_s = time.perf_counter() - t
  cost = compiled.cost_analysis()
  xla_flops = (cost[0] if isinstance(cost, list) else cost)["flops"]  # (loop bodies once)
  flops = model_flops_per_step(cfg, cfg.data.batch_size, cfg.data.max_source_length,
                               cfg.data.max_target_length)
  for _ in range(3):
    state, m = step(state, batch, rng)
  jax.block_until_ready(m)
  times = []
  for _ in range(FLAGS.steps):
    t = time.perf_counter()
    state, m = step(state, batch, rng)
    jax.block_until_ready(m)
    times.append(time.perf_counter() - t)
  step_s = statistics.median(times)
  return {"dtype": cfg.model.dtype, "compile_s": compile_s, "step_s": step_s,
          "tokens_per_s": real_tokens / step_s, "flops_per_step": flops, "xla_flops": xla_flops,
          "flops_per_token": flops / real_tokens, "achieved_flops": flops / step_s,
          "peak_memory_gb": peak_memory_gb()}


def run_peer() -> dict:
  out = subprocess.run([FLAGS.torch_python, str(PEER), "--config", FLAGS.shape, "--mode",
                        "train", "--steps", str(FLAGS.steps)],
                       capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main(_):
  if FLAGS.torch_python and not FLAGS.shape:
    raise app.UsageError("--torch_python needs --shape=small or base")
  dtypes = FLAGS.dtypes or [""]
  results = {d: [] for d in dtypes}
  peer = []
  for _ in range(FLAGS.rounds):
    for d in dtypes:
      results[d].append(measure(configure(FLAGS.config, d)))
      if FLAGS.torch_python:
        peer.append(run_peer()["tokens_per_s"])
  peak32, peak16 = matmul_peak(jnp.float32), matmul_peak(jnp.bfloat16)
  cfg = configure(FLAGS.config, dtypes[0])
  print(f"machine: {hardware.describe_machine()}, {jax.device_count()} "
        f"{jax.devices()[0].platform} device(s) ({jax.devices()[0].device_kind}); "
        f"jax {jax.__version__}; {time.strftime('%Y-%m-%d %H:%M')}")
  print(f"shape: {FLAGS.shape or 'config'}: d_model {cfg.model.d_model}, layers "
        f"{cfg.model.num_encoder_layers}+{cfg.model.num_decoder_layers}, heads "
        f"{cfg.model.num_heads}, FFN {cfg.model.d_ff}, vocab {cfg.model.vocab_size}, batch "
        f"{cfg.data.batch_size}x({cfg.data.max_source_length}+{cfg.data.max_target_length})")
  print(f"matmul peak: f32 {peak32 / 1e9:.0f} GFLOP/s, bf16->f32 {peak16 / 1e9:.0f} GFLOP/s")
  peer_tps = statistics.median(peer) if peer else None
  if peer:
    print(f"PyTorch peer ({FLAGS.shape}, eager, f32): {peer_tps:,.0f} tokens/s "
          f"(runs: {', '.join(f'{p:,.0f}' for p in peer)})")
  for d, runs in results.items():
    tps = statistics.median(r["tokens_per_s"] for r in runs)
    r = runs[-1]
    achieved = statistics.median(x["achieved_flops"] for x in runs)
    label = f"{d} -> {r['dtype']}" if d == "auto" else r["dtype"]
    line = (f"{label:>8}: {tps:,.0f} tokens/s (step {r['step_s'] * 1000:.0f} ms); "
            f"{r['flops_per_token'] / 1e6:.1f} model MFLOP/token (XLA counts "
            f"{r['xla_flops'] / r['flops_per_step'] * r['flops_per_token'] / 1e6:.1f}), "
            f"{achieved / 1e9:.0f} GFLOP/s = "
            f"MFU {100 * achieved / peak32:.0f}% of f32 peak / {100 * achieved / peak16:.0f}% "
            f"of bf16 peak; compile {r['compile_s']:.1f} s; peak memory "
            f"{r['peak_memory_gb']:.2f} GiB")
    if peer_tps:
      line += f"; {tps / peer_tps:.2f}x the PyTorch peer"
    print(line, flush=True)


if __name__ == "__main__":
  app.run(main)
