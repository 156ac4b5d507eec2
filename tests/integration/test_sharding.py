"""Data, FSDP and tensor parallelism on 8 fake CPU devices train like one device."""

import json
import subprocess
import sys

import pytest

from tests import helpers, model_variants
from tests.helpers import ROOT

SCRIPT = r"""
import functools, json, sys
import jax, numpy as np
sys.path.insert(0, ".")
from tests.helpers import ONE_LAYER, fixed_batch, tiny_setup
from transformer_jax.config.sections import MESH_AXES
from transformer_jax.errors import ConfigError
from transformer_jax.parallel import mesh as sharding
from transformer_jax.training import state as state_lib, step as step_lib

assert jax.device_count() == 8, jax.devices()
# 8 heads, vocab 512: every mesh axis below divides the parameters it splits. One layer per
# stack: each kind of parameter is there once. (No dropout: gradient accumulation draws other
# masks than one full-batch step.)
cfg, model, _ = tiny_setup(**{"model.num_heads": 8, "model.vocab_size": 512, **ONE_LAYER,
                              "model.dropout_rate": 0.0, **json.loads(sys.argv[2])})
results = {}
for shape, k in [((1, 1, 1), 1)] + [(tuple(s), k) for s, k in json.loads(sys.argv[1])]:
  n = int(np.prod(shape))
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:n]).reshape(shape), MESH_AXES)
  state, state_sharding = state_lib.create_state(cfg, model, mesh, jax.random.PRNGKey(0))
  step = jax.jit(functools.partial(step_lib.train_step, model=model, label_smoothing=0.1,
                                   num_micro_batches=k),
                 in_shardings=(state_sharding, sharding.batch_sharding(mesh),
                               sharding.replicated(mesh)),
                 out_shardings=(state_sharding, sharding.replicated(mesh)))
  losses = []
  for i in range(3):
    batch = sharding.global_batch(fixed_batch(seed=i), mesh)
    state, m = step(state, batch, jax.random.PRNGKey(7))
    losses.append(float(m["loss_sum"] / m["num_tokens"]))
  p = state.params
  shard = lambda x: list(x.sharding.shard_shape(x.shape))
  emb = p["source_embedding"]["embedding"]
  results[str(shape) + (f" k={k}" if k > 1 else "")] = {
      "losses": losses,
      "embedding": shard(emb),
      "wi": shard(p["encoder_0"]["feed_forward"].get("wi", p["encoder_0"]["feed_forward"]
                                                     .get("wi_gate"))["kernel"]),
      "key": shard(p["decoder_0"]["self_attention"]["key"]["kernel"]),
      "query": shard(p["decoder_0"]["cross_attention"]["query"]["kernel"]),
      "output": shard(p["encoder_0"]["self_attention"]["output"]["kernel"]),
      "adam_embedding": sorted({str(shard(x)) for x in jax.tree_util.tree_leaves(state.opt_state)
                                if x.shape == emb.shape}),
      "batch_devices": len(batch["inputs"].sharding.device_set),
      "ema_embedding": (shard(state.ema_params["source_embedding"]["embedding"])
                        if hasattr(state, "ema_params") else None)}
# The tiny config's vocabulary (500) and 4 heads cannot be split 8 ways: a clear error.
bad_cfg, bad_model, _ = tiny_setup()
mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(1, 1, 8), MESH_AXES)
try:
  state_lib.abstract_state(bad_cfg, bad_model, mesh)
except ConfigError as e:
  results["error"] = str(e)
print(json.dumps(results))
"""


# (mesh shape, micro-batches): each group in a process of its own next to its one-device
# reference (the groups can run in parallel).
MESHES = {"data, fsdp, tensor and micro-batches": [((8, 1, 1), 1), ((2, 4, 1), 1),
                                                  ((2, 2, 2), 1), ((1, 1, 8), 1),
                                                  ((2, 2, 2), 2)],
          "variants: rmsnorm, swiglu, 2 key/value heads, relative, EMA": [((2, 4, 1), 1),
                                                                     ((2, 2, 2), 1)],
          "variants: post-LN, rmsnorm, geglu, 1 key/value head, rotary, QK-norm": [((2, 4, 1), 1)]}
# config.model overrides per group (the block variants train on meshes like the plain model)
GROUP_VARIANTS = {
    "data, fsdp, tensor and micro-batches": {},
    "variants: rmsnorm, swiglu, 2 key/value heads, relative, EMA": {
        **model_variants.VARIANTS["rmsnorm_swiglu_gqa_relative"], "optimizer.ema_decay": 0.99},
    "variants: post-LN, rmsnorm, geglu, 1 key/value head, rotary, QK-norm":
        model_variants.VARIANTS["post_ln_rmsnorm_geglu_mqa_rotary_qk_norm"]}


@pytest.mark.parametrize("group", sorted(MESHES))
def test_meshes_match_one_device_and_split_parameters_as_configured(group):
  env = helpers.xla_env(8)
  variant = GROUP_VARIANTS[group]
  r = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(MESHES[group]),
                      json.dumps(variant)], cwd=ROOT,
                     env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads(r.stdout.strip().splitlines()[-1])
  error = results.pop("error")
  assert "cannot split" in error and "500 is not divisible by mesh axis tensor of size 8" in error
  one = results.pop("(1, 1, 1)")
  assert one["losses"][2] < one["losses"][0]
  V, D, F, H, K = 512, 32, 64, 8, 4
  G = variant.get("model.num_kv_heads", H)
  for shape, got in results.items():
    mesh_shape = shape.split(" k=")[0]  # "(2, 2, 2) k=2": 2 micro-batches on that mesh
    data, fsdp, tensor = json.loads(mesh_shape.replace("(", "[").replace(")", "]"))
    assert got["losses"] == pytest.approx(one["losses"], rel=1e-4), shape
    # d_model over fsdp, vocab / FFN width / heads over tensor (the default axis rules).
    assert got["embedding"] == [V // tensor, D // fsdp], shape
    assert got["wi"] == [D // fsdp, F // tensor], shape
    assert got["query"] == [D // fsdp, H // tensor, K], shape
    assert got["key"] == [D // fsdp, G // tensor, K], shape
    assert got["output"] == [H // tensor, K, D // fsdp], shape
    # Adam's moments are split like their parameters (FSDP shards the optimizer state too).
    assert got["adam_embedding"] == [str([V // tensor, D // fsdp])], shape
    assert got["batch_devices"] == data * fsdp * tensor, shape
    if "optimizer.ema_decay" in variant:  # (the moving average is split like its parameters)
      assert got["ema_embedding"] == got["embedding"], shape
