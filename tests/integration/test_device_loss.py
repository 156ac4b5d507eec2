"""The output loss per device on 8 fake CPU devices: the same sums and gradients as the plain
loss over the global batch, and in the compiled train step the output-matrix gradient's
all-reduce comes after the tile loop, never inside it."""

import json
import os
import subprocess
import sys

from tests.helpers import ROOT

SCRIPT = r"""
import functools, json, re, sys
import jax, jax.numpy as jnp, numpy as np
sys.path.insert(0, ".")
from jax.sharding import NamedSharding, PartitionSpec as P
from tests.helpers import ONE_LAYER, fixed_batch, tiny_setup
from transformer_jax.config.sections import MESH_AXES
from transformer_jax.ops import losses
from transformer_jax.parallel import mesh as mesh_lib
from transformer_jax.training import state as state_lib, step as step_lib

assert jax.device_count() == 8, jax.devices()
out = {}
mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(4, 2, 1), MESH_AXES)
rng = np.random.default_rng(0)
N, D, V = 8 * 512, 32, 300
h = jnp.asarray(rng.normal(size=(N, D)), jnp.float32)
table = jnp.asarray(rng.normal(size=(V, D)) * 0.1, jnp.float32)
targets = jnp.asarray(rng.integers(1, V, N), jnp.int32)
weights = jnp.asarray(rng.random(N) > 0.2, jnp.float32)
tokens = NamedSharding(mesh, P(mesh_lib.BATCH_AXES))
args = [jax.device_put(x, tokens) for x in (h, targets, weights)]

def value_and_grads(fn):
  f = lambda h, t, y, w: fn(h, t, y, w)[0]
  sums = jax.jit(fn)(args[0], table, args[1], args[2])
  grads = jax.jit(jax.grad(f, argnums=(0, 1)))(args[0], table, args[1], args[2])
  return [np.asarray(x).tolist() for x in sums], [np.asarray(g) for g in grads]

plain = value_and_grads(lambda h, t, y, w: losses.output_loss(h, t, y, w, 0.1, jnp.float32))
for tile in (256, 0):
  dev = value_and_grads(lambda h, t, y, w: losses.device_output_loss(
      h, t, y, w, 0.1, jnp.float32, tile, mesh, mesh_lib.BATCH_AXES))
  out[f"tile {tile}"] = {
      "sums": [abs(a - b) / abs(a) for a, b in zip(plain[0], dev[0])],
      "grads": [float(np.abs(a - b).max() / np.abs(a).max()) for a, b in zip(plain[1], dev[1])]}
# bf16 logits (TPUs' auto) per device, against the same loss on one device
one = value_and_grads(lambda h, t, y, w: losses.output_loss(h, t, y, w, 0.1, jnp.bfloat16, 0,
                                                            jnp.bfloat16))
dev = value_and_grads(lambda h, t, y, w: losses.device_output_loss(
    h, t, y, w, 0.1, jnp.bfloat16, 0, mesh, mesh_lib.BATCH_AXES, "bfloat16"))
out["bf16 logits"] = {
    "sums": [abs(a - b) / abs(a) for a, b in zip(one[0], dev[0])],
    "grads": [float(np.abs(a - b).max() / np.abs(a).max()) for a, b in zip(one[1], dev[1])],
    "against f32": abs(one[0][0] - plain[0][0]) / abs(plain[0][0])}

# The train step of the tiny model on a (8, 1, 1) mesh: where the table-gradient all-reduce is.
cfg, model, _ = tiny_setup(**{"model.vocab_size": 512, **ONE_LAYER})
mesh8 = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(8, 1, 1), MESH_AXES)
state, state_sharding = state_lib.create_state(cfg, model, mesh8, jax.random.PRNGKey(0))
batch = mesh_lib.global_batch(fixed_batch(rows=16, length=32, vocab=512), mesh8)
V, D = 512, cfg.model.d_model
for name, m in (("per-device", mesh8), ("global", None)):
  step = jax.jit(functools.partial(step_lib.train_step, model=model, label_smoothing=0.1, mesh=m),
                 in_shardings=(state_sharding, mesh_lib.batch_sharding(mesh8),
                               mesh_lib.replicated(mesh8)))
  hlo = step.lower(state, batch, jax.random.PRNGKey(1)).compile().as_text()
  # Computations by name; those a while loop runs (bodies and what they call), transitively.
  comps = dict(re.findall(r"(?ms)^(?:ENTRY )?%?([\w.\-]+) [^\n]*\{\n(.*?)^\}", hlo))
  inside = set(re.findall(r"body=%?([\w.\-]+)", hlo))
  todo = list(inside)
  while todo:
    called = r"(?:to_apply|calls|body|condition|branch_computations)=\{?%?([\w.\-]+)"
    for callee in re.findall(called, comps.get(todo.pop(), "")):
      if callee not in inside:
        inside.add(callee)
        todo.append(callee)
  table_reduces = [(c, line) for c, body in comps.items() for line in body.splitlines()
                   if re.search(rf"all-reduce(-start)?\(", line) and f"f32[{V},{D}]" in line]
  out[name] = {"all_reduces_of_table_grad": len(table_reduces),
               "in_loops": sum(c in inside for c, _ in table_reduces),
               "loops": len(re.findall(r" while\(", hlo))}
print(json.dumps(out))
"""


def test_per_device_loss_equals_the_plain_loss_and_reduces_once_after_the_loop():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  out = json.loads(r.stdout.strip().splitlines()[-1])
  for tile in ("tile 256", "tile 0"):  # (16 tiles of 256 per device, and one of 512)
    assert max(out[tile]["sums"]) < 1e-5, out
    assert max(out[tile]["grads"]) < 1e-5, out
  bf16 = out["bf16 logits"]  # (the per-device sums of bf16 products: bf16-level agreement)
  assert max(bf16["sums"]) < 1e-4 and max(bf16["grads"]) < 2e-2, bf16
  assert 0 < bf16["against f32"] < 1e-2, bf16
  # The global loss's scan over tiles all-reduces the table gradient in its loop (the
  # behaviour this replaces); per device, the one all-reduce is outside every loop.
  assert out["global"]["in_loops"] >= 1, out
  assert out["per-device"]["all_reduces_of_table_grad"] >= 1, out
  assert out["per-device"]["in_loops"] == 0, out
