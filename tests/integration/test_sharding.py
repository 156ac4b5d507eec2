"""Data, FSDP and tensor parallelism on 8 fake CPU devices train like one device."""

import json
import subprocess
import sys

import numpy as np
import pytest

from tests import helpers, model_variants
from tests.helpers import ROOT

SCRIPT = r"""
import dataclasses, functools, json, sys
import jax, numpy as np
sys.path.insert(0, ".")
from tests.helpers import (ONE_LAYER, fixed_batch, fsdp_split, tiny_setup, tiny_train_config,
                           whole_gradient_sums)
from transformer_jax.aot import hlo
from transformer_jax.config.sections import MESH_AXES
from transformer_jax.errors import ConfigError
from transformer_jax.model.transformer import Transformer
from transformer_jax.parallel import mesh as sharding
from transformer_jax.training import population as pl, state as state_lib, step as step_lib

assert jax.device_count() == 8, jax.devices()
# 8 heads, vocab 512: every mesh axis below divides the parameters it splits. One layer per
# stack: each kind of parameter is there once. (No dropout: gradient accumulation draws other
# masks than one full-batch step.)
overrides = {"model.num_heads": 8, "model.vocab_size": 512, **ONE_LAYER,
             "model.dropout_rate": 0.0, **json.loads(sys.argv[2])}
cfg, model, _ = tiny_setup(**overrides)
init_key, dropout_key = jax.random.PRNGKey(0), jax.random.PRNGKey(7)
results = {}
for shape, k in [((1, 1, 1), 1)] + [(tuple(s), k) for s, k in json.loads(sys.argv[1])]:
  n = int(np.prod(shape))
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:n]).reshape(shape), MESH_AXES)
  state, state_sharding = state_lib.create_state(cfg, model, mesh, init_key)
  step = jax.jit(functools.partial(step_lib.train_step, model=model,
                                   label_smoothing=cfg.label_smoothing, num_micro_batches=k,
                                   mesh=mesh, param_shardings=state_sharding.params
                                   if shape[1] > 1 else None),
                 in_shardings=(state_sharding, sharding.batch_sharding(mesh),
                               sharding.replicated(mesh)),
                 out_shardings=(state_sharding, sharding.replicated(mesh)))
  losses = []
  for i in range(3):
    batch = sharding.global_batch(fixed_batch(seed=i), mesh)
    state, m = step(state, batch, dropout_key)
    losses.append(float(m["loss_sum"] / m["num_tokens"]))
  p = state.params
  if shape == (2, 4, 1) and k == 1:  # FSDP's collectives, as XLA:CPU compiles them
    module = hlo.Module.parse(step.lower(state, batch, dropout_key).compile().as_text())
    split, whole = fsdp_split(p, jax.tree.map(lambda x: x.sharding, p))
    size = lambda xs: sum(x.size * x.dtype.itemsize for x in xs)
    found = module.collectives()
    results["fsdp collectives"] = {
        "whole gradient sums": whole_gradient_sums(module, split),
        "reduce-scatter": [found["reduce-scatter"].count, found["reduce-scatter"].bytes],
        "all-reduce bytes": found["all-reduce"].bytes,
        "split matrices": [sum(len(x.shape) > 1 for x in split),
                           size(x for x in split if len(x.shape) > 1)],
        "split bytes": size(split), "whole bytes": size(whole)}
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

# A population of two on each mesh of argv[3], vmapped (the program GPUs and TPUs run).
# Member 0 is the config above, with its keys: its run alone on that mesh is the mesh's entry.
# Member 1 differs in seed, learning rate, label smoothing, dropout and attention dropout:
# trained alone here.
def train(step, state, rngs, mesh):
  losses = []
  for i in range(3):
    state, m = step(state, sharding.global_batch(fixed_batch(seed=i), mesh), rngs)
    losses.append(np.asarray(m["loss_sum"] / m["num_tokens"]).tolist())
  return state, losses

for shape in json.loads(sys.argv[3]):
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(shape), MESH_AXES)
  pop = pl.Population.of(tiny_train_config(**overrides, **{
      "population.program": "vmapped", "population.seed": (cfg.seed, cfg.seed + 1),
      "population.learning_rate": (cfg.optimizer.learning_rate, 1e-3),
      "population.label_smoothing": (cfg.label_smoothing, 0.0),
      "population.dropout_rate": (0.0, 0.2), "population.attention_dropout_rate": (0.0, 0.1)}))
  assert dataclasses.replace(pop.members[0], data_seed=cfg.data_seed,
                             population=cfg.population) == cfg
  member = pop.members[1]
  member_init_key, member_dropout_key = jax.random.split(jax.random.PRNGKey(member.seed))
  init, pop_sharding = pl.population_init(pop, mesh)
  state, together = train(pl.compile_population_step(pop, mesh, pop_sharding),
                          init(np.stack([init_key, member_init_key])),
                          np.stack([dropout_key, member_dropout_key]), mesh)
  emb = state.members.params["source_embedding"]["embedding"]
  member_model = Transformer(member.model)
  state, state_sharding = state_lib.create_state(member, member_model, mesh, member_init_key)
  _, alone = train(step_lib.compile_step(member, member_model, mesh, state_sharding), state,
                   member_dropout_key, mesh)
  results[f"population {tuple(shape)}"] = {
      "together": together, "member 1 alone": alone,
      "embedding": list(emb.sharding.shard_shape(emb.shape))}
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
# The meshes a population of two trains on (data and FSDP), per group.
POPULATION_MESHES = {"data, fsdp, tensor and micro-batches": [(2, 4, 1)]}
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
                      json.dumps(variant), json.dumps(POPULATION_MESHES.get(group, []))],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  results = json.loads(r.stdout.strip().splitlines()[-1])
  for shape in POPULATION_MESHES.get(group, []):
    # Each member as it trains alone on the same mesh (float32 rounding: the members' matmuls
    # run batched), its arrays split as a run alone's.
    got = results.pop(f"population {shape}")
    together = np.asarray(got["together"])  # (steps, members)
    np.testing.assert_allclose(together[:, 0], results[str(shape)]["losses"], rtol=1e-5)
    np.testing.assert_allclose(together[:, 1], got["member 1 alone"], rtol=1e-5)
    assert not np.allclose(together[:, 0], together[:, 1], rtol=1e-3)
    assert got["embedding"] == [2, 512 // shape[2], 32 // shape[1]]
  if "fsdp collectives" in results:  # the gradients of the split matrices reduce-scattered
    got = results.pop("fsdp collectives")
    assert got["whole gradient sums"] == []
    # each of the 4 fsdp devices receives a quarter of every split matrix's summed gradient;
    # what is all-reduced: those quarters over `data`, and the parameters kept whole
    assert got["reduce-scatter"][0] >= got["split matrices"][0]
    assert got["reduce-scatter"][1] >= got["split matrices"][1] / 4
    assert got["all-reduce bytes"] <= got["split bytes"] / 4 + got["whole bytes"] + 1024
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
