"""The accelerator check: one command that tells what a device does with this code, as JSON lines.

  python benchmarks/gpu_check.py --out=/tmp/gpu_check            # on a GPU: wmt_base's shape
  python benchmarks/gpu_check.py --tiny --out=/tmp/gpu_check     # anywhere: the tiny config

Prints one JSON object per line (and writes them to OUT/gpu_check.jsonl), each with a "check":
- "machine": backend, device kind and count, jax version, CPU, XLA_FLAGS;
- "matmul_peak": bf16-in/f32-accumulate and f32 matmul GFLOP/s (4096² on accelerators);
- "train_step", once per attention implementation (`config.model.attention_impl`: our einsum
  products, and jax.nn.dot_product_attention through XLA and, on GPUs, cuDNN) in the config's
  own numerics (`auto` activations: bf16 on GPUs), then with the last of them in f32
  activations (`config.model.activation_dtype`), and in one output-loss tile
  (`config.model.loss_tile_tokens=0`; `effective_loss_tile`: the tile the config resolves
  to, on accelerators at least 8192 tokens), and the first variant again after the others
  (`repeat`: how far the machine drifted while they ran); then wmt_big's step (the tiny
  config at twice the width with --tiny): compile time, step time, real tokens/s, analytic
  model FLOPs per token and MFU against the bf16 peak, peak device memory (host RSS on
  CPU), and on a GPU of the compile tool's targets its prediction for the compiled step
  (`predicted_step_ms`: `transformer-jax-compile`'s GPU roofline of this program);
- "population": a population of K = 1, 4, 16 seeds of the default config (K = 1, 2 of the
  tiny one with --tiny) trained as one program: member-steps per second against a single
  run's steps;
- "engine": the decoding engine every tool decodes through (`decoding.engine.SearchEngine`),
  on the default config's test set (test2016; 16 validation sentences with --tiny) with random
  weights and a tokenizer trained on the corpus there and then: the first decode (its
  programs compiled) and a warm one, in sentences/s;
- "decode": beam-4 sentences/s of the same model (random weights, fixed-length outputs) for
  each `config.decode.beam_impl` at two batch sizes, and whether flat's outputs equal gather's;
- "determinism": whether two identical steps (same state, batch and key) give bit-identical
  parameters, with the XLA_FLAGS in effect (on GPUs: pass `--deterministic` to set
  `--xla_gpu_deterministic_ops=true` before JAX starts).
Any check that fails prints {"check": ..., "error": ...} and the others still run.
"""

import argparse
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARSER = argparse.ArgumentParser(description=__doc__.splitlines()[0])
PARSER.add_argument("--tiny", action="store_true", help="the tiny config's shape (CPU tests)")
PARSER.add_argument("--out", default="", help="folder for gpu_check.jsonl")
PARSER.add_argument("--steps", type=int, default=10, help="timed training steps per variant")
PARSER.add_argument("--deterministic", action="store_true",
                    help="set --xla_gpu_deterministic_ops=true (before JAX starts)")

if __name__ == "__main__":  # (XLA_FLAGS must be set before JAX is imported)
  ARGS = PARSER.parse_args()
  if ARGS.deterministic:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_gpu_deterministic_ops=true").strip()

import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from measure import matmul_peak, model_flops_per_step, peak_memory_gb  # noqa: E402

from transformer_jax.aot import hlo, report, targets  # noqa: E402
from transformer_jax.config.parse import from_config_dict  # noqa: E402
from transformer_jax.configs import default, tiny, wmt_base, wmt_big  # noqa: E402
from transformer_jax.data import corpus, plan  # noqa: E402
from transformer_jax.data.eval_sets import read_split  # noqa: E402
from transformer_jax.data.tokenizer import train_tokenizer  # noqa: E402
from transformer_jax.decoding.engine import SearchEngine  # noqa: E402
from transformer_jax.decoding.ensemble import prepare  # noqa: E402
from transformer_jax.decoding.search import beam_search  # noqa: E402
from transformer_jax.model.attention import attention_implementation  # noqa: E402
from transformer_jax.model.transformer import Transformer  # noqa: E402
from transformer_jax.ops.losses import tile_for  # noqa: E402
from transformer_jax.parallel import hardware, numerics  # noqa: E402
from transformer_jax.parallel import mesh as mesh_lib  # noqa: E402
from transformer_jax.training import population as pl  # noqa: E402
from transformer_jax.training.state import create_state  # noqa: E402
from transformer_jax.training.step import compile_step, train_step  # noqa: E402

RNG = jax.random.PRNGKey(1)  # the dropout key of every measured step


def run_config(tiny_shape: bool, big: bool = False, module=wmt_base):
  """The config measured: wmt_base, or `big` wmt_big, or `module`'s (the tiny config with
  --tiny, twice as wide for `big`), one device, auto numerics."""
  config = tiny.get_config() if tiny_shape else (wmt_big if big else module).get_config()
  if tiny_shape:  # (one layer per stack: the test suite runs it, compiling its programs)
    config.data.batch_size, config.data.max_source_length = 8, 16
    config.data.max_target_length = 16
    config.model.num_encoder_layers = config.model.num_decoder_layers = 1
    if big:
      config.model.d_model, config.model.d_ff = 64, 128
  config.model.dtype = "auto"
  config.num_train_steps = max(config.num_train_steps, 1)  # (steps timed, not a planned run)
  config.parallelism.mesh_shape = (1, 1, 1)
  cfg = from_config_dict(config)
  dtype = numerics.resolve("auto").dtype
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype=dtype))


def synthetic_batch(cfg, seed: int = 0) -> dict:
  rng = np.random.default_rng(seed)
  rows, S, T = cfg.data.batch_size, cfg.data.max_source_length, cfg.data.max_target_length
  return {"inputs": rng.integers(3, cfg.model.vocab_size, (rows, S)).astype(np.int32),
          "targets": rng.integers(3, cfg.model.vocab_size, (rows, T)).astype(np.int32)}


@functools.lru_cache(maxsize=None)
def compiled_step(cfg):
  """(initial state, compiled train step, batch, compile seconds) of `cfg`, compiled once: the
  determinism check reuses the first variant's program."""
  mesh = mesh_lib.make_mesh(cfg.parallelism, jax.devices()[:1])
  model = Transformer(cfg.model)
  state, state_sharding = create_state(cfg, model, mesh, jax.random.PRNGKey(0))
  step = jax.jit(functools.partial(train_step, model=model, label_smoothing=cfg.label_smoothing,
                                   mesh=mesh),
                 in_shardings=(state_sharding, mesh_lib.batch_sharding(mesh),
                               mesh_lib.replicated(mesh)),
                 out_shardings=(state_sharding, mesh_lib.replicated(mesh)))
  batch = mesh_lib.global_batch(synthetic_batch(cfg), mesh)
  t = time.perf_counter()
  compiled = step.lower(state, batch, RNG).compile()
  return state, compiled, batch, time.perf_counter() - t


def check_train_step(cfg, steps: int, peak_bf16: float) -> dict:
  state, compiled, batch, compile_s = compiled_step(cfg)
  state, m = compiled(state, batch, RNG)
  jax.block_until_ready(m)
  t = time.perf_counter()
  for _ in range(steps):
    state, m = compiled(state, batch, RNG)
  jax.block_until_ready(m)
  step_s = (time.perf_counter() - t) / steps
  tokens = cfg.data.batch_size * (cfg.data.max_source_length + cfg.data.max_target_length)
  flops = model_flops_per_step(cfg, cfg.data.batch_size, cfg.data.max_source_length,
                               cfg.data.max_target_length)
  chip = targets.gpu_chip(jax.devices()[0].device_kind)
  predicted = None if chip is None else report.gpu_estimate(
      hlo.Module.parse(compiled.as_text()), flops, chip, 1).seconds
  return {"config": f"d_model {cfg.model.d_model}, {cfg.model.num_encoder_layers}+"
                    f"{cfg.model.num_decoder_layers} layers",
          "attention_impl": cfg.model.attention_impl,
          "loss_tile_tokens": cfg.model.loss_tile_tokens,
          "effective_loss_tile": tile_for(jax.default_backend(), cfg.model.loss_tile_tokens,
                                          cfg.model.vocab_size),
          "activation_dtype": cfg.model.activation_dtype,
          "predicted_step_ms": None if predicted is None else round(predicted * 1000, 2),
          "resolved_impl": attention_implementation(cfg.model), "dtype": cfg.model.dtype,
          "compile_s": round(compile_s, 2), "step_ms": round(step_s * 1000, 2),
          "tokens_per_s": round(tokens / step_s),
          "model_mflops_per_token": round(flops / tokens / 1e6, 1),
          "mfu_bf16_peak": round(flops / step_s / 1e9 / peak_bf16, 3),
          "peak_memory_gb": peak_memory_gb(), "loss": float(m["loss_sum"] / m["num_tokens"])}


def check_decode(cfg) -> dict:
  """Both ways of keeping the beam's caches (`config.decode.beam_impl`) on the same sources
  and weights, at two batch sizes: sentences/s and whether their outputs agree (the tiny
  shape in f32, where they must agree exactly: in bf16 products of other shapes round
  differently, and random weights have near-ties)."""
  tiny_shape = cfg.model.d_model < 128
  if tiny_shape:
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, dtype="float32"))
  model = Transformer(cfg.model)
  length = 16 if tiny_shape else 32
  sizes = (4, 8) if tiny_shape else (64, 512)
  src = np.random.default_rng(2).integers(3, cfg.model.vocab_size, (max(sizes), length)).astype(
      np.int32)
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), src[:1], src[:1, :4])["params"])
  runs, outputs = [], {}
  for rows in sizes:
    for impl in ("gather", "flat"):
      search = functools.partial(beam_search, prepare(model, params), beam_size=4, alpha=0.6,
                                 max_len=length, min_len=length,
                                 beam_impl=impl)  # (one program per shape)
      t = time.perf_counter()
      jax.block_until_ready(search(src[:rows]))
      cold_s = time.perf_counter() - t
      t = time.perf_counter()
      outputs[rows, impl] = search(src[:rows])
      warm_s = time.perf_counter() - t
      runs.append({"beam_impl": impl, "sentences": rows, "first_call_s": round(cold_s, 2),
                   "sentences_per_s": round(rows / warm_s, 1)})
    (g_seqs, g_scores), (f_seqs, f_scores) = outputs[rows, "gather"], outputs[rows, "flat"]
    runs[-1]["same_best_as_gather"] = float(np.mean(np.all(g_seqs[:, 0] == f_seqs[:, 0], -1)))
    runs[-1]["max_score_difference"] = float(np.max(np.abs(g_scores - f_scores)))
  return {"beam": 4, "new_tokens": length, "dtype": cfg.model.dtype, "runs": runs}


def check_population(cfg, steps: int, sizes: tuple[int, ...]) -> dict:
  """Member-steps per second of K (`sizes`) seeds trained as one program (the program
  `config.population.seeds=K` compiles), against a single run's steps, on the same batch."""
  mesh = mesh_lib.make_mesh(cfg.parallelism, jax.devices()[:1])
  batch = mesh_lib.global_batch(synthetic_batch(cfg), mesh)
  model = Transformer(cfg.model)
  state, sharding = create_state(cfg, model, mesh, jax.random.PRNGKey(0))
  scale = [np.float32(1.0)] * (cfg.optimizer.cooldown_fraction > 0)
  runs = [{"members": "single run", **_timed(compile_step(cfg, model, mesh, sharding), state,
                                              batch, RNG, steps, scale)}]
  for k in sizes:
    pop = pl.Population.of(dataclasses.replace(
        cfg, population=dataclasses.replace(cfg.population, seeds=k)))
    init, pop_sharding = pl.population_init(pop, mesh)
    init_keys, dropout_keys = pl.member_rngs(pop)
    timed = _timed(pl.compile_population_step(pop, mesh, pop_sharding), init(init_keys), batch,
                   dropout_keys, steps, scale)
    runs.append({"members": k, "program": pl.member_program(pop.base), **timed,
                 "member_steps_per_s": round(k / timed["step_ms"] * 1000, 2)})
  single = runs[0]["step_ms"]
  for run in runs[1:]:
    run["vs_single_runs"] = round(run["member_steps_per_s"] * single / 1000, 2)
  return {"config": f"d_model {cfg.model.d_model}", "runs": runs}


def _timed(step, state, batch, rng, steps: int, scale: list) -> dict:
  """Compile time (with two warm-up steps) and warm step time of `step` (`scale`: its
  cooldown factor, an argument only with a cooldown)."""
  t = time.perf_counter()
  for _ in range(2):
    state, metrics = step(state, batch, rng, *scale)
  jax.block_until_ready(metrics)
  compile_s = time.perf_counter() - t
  t = time.perf_counter()
  for _ in range(steps):
    state, metrics = step(state, batch, rng, *scale)
  jax.block_until_ready(metrics)
  return {"compile_s": round(compile_s, 2),
          "step_ms": round((time.perf_counter() - t) / steps * 1000, 2)}


def check_engine(cfg, max_sentences: int) -> dict:
  """The decoding engine's first (compiling) and warm decode of the config's test set, random
  weights: outputs run to the length cap, a worst case for the search's steps."""
  data = cfg.data
  train = plan.own_split("train", data, data.train_split)
  with tempfile.TemporaryDirectory() as folder:
    tokenizer = train_tokenizer((s for pair in corpus.iterate_pairs(train.spec, train.split)
                                 for s in pair), cfg.model.vocab_size,
                                Path(folder) / "spm.model", max_sentences=20_000)
  split = data.test_split or data.eval_split  # (the tiny config tests on none)
  eval_set = read_split(plan.own_split(split, data, split), tokenizer, max_sentences)
  model = Transformer(cfg.model)
  tokens = np.ones((1, 4), np.int32)
  params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), tokens, tokens)["params"])
  engine = SearchEngine(prepare(model, params), tokenizer, cfg.decode)
  runs = []
  for _ in range(2):
    t = time.perf_counter()
    engine.translate_set(eval_set)
    runs.append(time.perf_counter() - t)
  n = len(eval_set.sources)
  return {"split": split, "sentences": n, "beam": cfg.decode.beam_size,
          "first_decode_s": round(runs[0], 2), "warm_sentences_per_s": round(n / runs[1], 1)}


def check_determinism(cfg) -> dict:
  state, compiled, batch, _ = compiled_step(cfg)
  a, _ = compiled(state, batch, RNG)
  b, _ = compiled(state, batch, RNG)
  same = all(bool(jnp.array_equal(x, y)) for x, y in
             zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)))
  return {"bit_identical": same, "xla_flags": os.environ.get("XLA_FLAGS", "")}


def main(args):
  out_file = None
  if args.out:
    Path(args.out).mkdir(parents=True, exist_ok=True)
    out_file = open(Path(args.out) / "gpu_check.jsonl", "a", encoding="utf-8")  # noqa: SIM115

  def emit(check: str, fn):
    try:
      record = {"check": check, **fn()}
    except Exception as e:  # noqa: BLE001 (a failed check is reported, the others run)
      record = {"check": check, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
      traceback.print_exc(file=sys.stderr)
    line = json.dumps(record)
    print(line, flush=True)
    if out_file:
      out_file.write(line + "\n")
      out_file.flush()
    return record

  device = jax.devices()[0]
  emit("machine", lambda: {"backend": jax.default_backend(), "device_kind": device.device_kind,
                           "device_count": jax.device_count(), "jax": jax.__version__,
                           "cpu": hardware.describe_machine(),
                           "xla_flags": os.environ.get("XLA_FLAGS", "")})
  n = 512 if args.tiny else (4096 if jax.default_backend() != "cpu" else 2048)
  peaks = emit("matmul_peak", lambda: {"n": n,
                                       "bf16_gflops": round(matmul_peak(jnp.bfloat16, n) / 1e9),
                                       "f32_gflops": round(matmul_peak(jnp.float32, n) / 1e9)})
  cfg = run_config(args.tiny)
  impls = ["einsum", "xla"] + (["cudnn"] if jax.default_backend() == "gpu" else [])
  variants = [dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, attention_impl=impl))
              for impl in impls]
  last = variants[-1].model
  variants += [dataclasses.replace(cfg, model=dataclasses.replace(last, **change)) for change in
               ({"activation_dtype": "float32"}, {"loss_tile_tokens": 0})]
  variants += [variants[0], run_config(args.tiny, big=True)]
  for i, variant in enumerate(variants):
    emit("train_step", lambda v=variant, i=i: {
        **check_train_step(v, args.steps, peaks.get("bf16_gflops", 1.0)),
        "repeat": i == len(variants) - 2})
  emit("population", lambda: check_population(run_config(args.tiny, module=default),
                                              args.steps, (1, 2) if args.tiny else (1, 4, 16)))
  emit("engine", lambda: check_engine(run_config(args.tiny, module=default),
                                      16 if args.tiny else 0))
  emit("decode", lambda: check_decode(cfg))
  emit("determinism", lambda: check_determinism(variants[0]))  # (the einsum step, compiled)
  if out_file:
    out_file.close()


if __name__ == "__main__":
  main(ARGS)
