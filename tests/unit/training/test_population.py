"""A population in one program (training.population): its members' configs, each member
following its config run alone step for step, and the mask that freezes a member."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.helpers import (
  ONE_LAYER,
  _mesh,
  checkpoint_steps,
  fixed_batch,
  read_metrics,
  tiny_config,
  tiny_train_config,
  train_in_process,
)
from transformer_jax.config.parse import from_config_dict
from transformer_jax.errors import ConfigError
from transformer_jax.model.transformer import Transformer
from transformer_jax.ops.dropout import Dropout
from transformer_jax.training import population as pl
from transformer_jax.training.population_run import member_config_dict, spread
from transformer_jax.training.state import create_state
from transformer_jax.training.step import compile_step

STEPS = 50
# Four members that differ in learning rate, dropout, label smoothing and seed (the tiny
# config with one layer per stack: what vmap does to a layer it does to every layer).
FOUR = {**ONE_LAYER, "population.learning_rate": (3e-3, 1e-3, 5e-3, 2e-3),
        "population.dropout_rate": (0.1, 0.0, 0.3, 0.2),
        "population.label_smoothing": (0.1, 0.0, 0.2, 0.1),
        "population.seed": (0, 1, 2, 3)}


def _losses(metrics):
  m = jax.device_get(metrics)
  return m["loss_sum"] / m["num_tokens"]


def _population_losses(program: str):
  """STEPS f32 steps of the four members as one population: losses (STEPS, 4)."""
  pop = pl.Population.of(tiny_train_config(**FOUR, **{"population.program": program}))
  init, sharding = pl.population_init(pop, _mesh())
  init_keys, dropout_keys = pl.member_rngs(pop)
  state = init(init_keys)
  step = pl.compile_population_step(pop, _mesh(), sharding)
  losses = []
  for seed in range(STEPS):
    state, metrics = step(state, fixed_batch(seed=seed), dropout_keys)
    losses.append(_losses(metrics))
  return pop, np.asarray(losses)


def test_each_member_follows_its_config_run_alone_in_either_program():
  """The train step a run of each member's config compiles, its keys drawn as a run draws
  them, against the members trained as one vmapped and as one unrolled program."""
  pop, vmapped = _population_losses("vmapped")
  _, unrolled = _population_losses("unrolled")
  for member, cfg in enumerate(pop.members):
    model = Transformer(cfg.model)
    init_key, dropout_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
    state, sharding = create_state(cfg, model, _mesh(), init_key)
    step = compile_step(cfg, model, _mesh(), sharding)
    alone = []
    for seed in range(STEPS):
      state, metrics = step(state, fixed_batch(seed=seed), dropout_key)
      alone.append(_losses(metrics))
    # (equal to float32 rounding: the vmapped members' matmuls run batched)
    for together in (vmapped, unrolled):
      np.testing.assert_allclose(together[:, member], alone, rtol=1e-4, err_msg=str(member))
      for other in set(range(4)) - {member}:  # (and to no other member's)
        assert not np.allclose(together[:, other], alone, rtol=1e-3)


def test_members_take_their_values_and_the_run_s_others():
  cfg = tiny_train_config(**{"population.seeds": 3, "population.learning_rate": (1e-3, 2e-3,
                                                                                  4e-3),
                             "seed": 7, "label_smoothing": 0.2})
  members = pl.member_configs(cfg)
  assert [m.seed for m in members] == [7, 8, 9]
  assert [m.optimizer.learning_rate for m in members] == [1e-3, 2e-3, 4e-3]
  assert {m.label_smoothing for m in members} == {0.2}
  assert {m.batch_seed for m in members} == {7}  # (the population's batches, not seed + i)
  assert {m.population.size for m in members} == {0}
  assert pl.varying_keys(cfg) == ("seed", "learning_rate")


def test_a_member_s_config_file_loads_as_that_member():
  c = tiny_config(**FOUR)
  cfg = from_config_dict(c)
  for member in pl.member_configs(cfg):
    assert from_config_dict(type(c)(member_config_dict(c.to_dict(), member))) == member


@pytest.mark.parametrize("overrides, message", [
    ({"population.seeds": 2, "population.learning_rate": (1e-3, 2e-3, 3e-3)},
     r"config\.population: the members' values differ in number \(learning_rate: 3, "
     r"seeds=2\)"),
    ({"population.seeds": 2, "population.seed": (1, 2)}, "give seeds=N or seed="),
    ({"population.dropout_rate": (0.1, 1.5)},
     r"config\.population, member 1: config\.model\.dropout_rate=1\.5 must be in \[0, 1\)"),
    ({"population.grad_clip_norm": (0.0, 1.0)},
     r"config\.population\.grad_clip_norm=\(0\.0, 1\.0\): 0 turns clipping off"),
    ({"population.seeds": -1}, r"population\.seeds=-1 must be >= 0"),
])
def test_a_population_that_cannot_be_one_program_is_named(overrides, message):
  with pytest.raises(ConfigError, match=message):
    pl.member_configs(tiny_train_config(**overrides))


@pytest.mark.parametrize("policy, program", [("stop", "unrolled"), ("skip", "vmapped")])
def test_a_stopped_member_is_left_as_it_is_and_a_non_finite_update_stops_one(policy, program):
  """Member 1 stopped before the first step: not trained, its step counter included (the
  vmapped program masks its update, the unrolled one skips its step). Step 2 is non-finite
  for all: under "stop" every member stops there, under "skip" none."""
  pop = pl.Population.of(tiny_train_config(**{**ONE_LAYER, "population.seeds": 3,
                                              "nonfinite_updates": policy,
                                              "population.program": program}))
  init, sharding = pl.population_init(pop, _mesh())
  init_keys, dropout_keys = pl.member_rngs(pop)
  state = init(init_keys).replace(active=np.array([True, False, True]))
  before = jax.device_get(state)
  step = pl.compile_population_step(pop, _mesh(), sharding, nonfinite_at_step=2)
  state, metrics = step(state, fixed_batch(), dropout_keys)
  after = jax.device_get(state)
  np.testing.assert_array_equal(after.members.step, [1, 0, 1])
  np.testing.assert_array_equal(metrics["steps"], [1, 0, 1])
  for b, a in zip(jax.tree_util.tree_leaves(before.members.params),
                  jax.tree_util.tree_leaves(after.members.params)):
    assert np.array_equal(a[1], b[1]) and not np.array_equal(a[0], b[0])
  state, metrics = jax.device_get(step(state, fixed_batch(), dropout_keys))
  np.testing.assert_array_equal(metrics["nonfinite_steps"], [1, 0, 1])
  np.testing.assert_array_equal(state.active, [policy == "skip", False, policy == "skip"])
  for b, a in zip(jax.tree_util.tree_leaves(after.members.params),
                  jax.tree_util.tree_leaves(state.members.params)):
    assert np.array_equal(a, b)  # (the non-finite update not applied)


def test_spread_is_the_mean_and_sample_deviation_over_members():
  out = spread({0: {"test/bleu": 30.0, "eval/bleu": 1.0}, 1: {"test/bleu": 32.0},
                2: {"test/bleu": 34.0}})
  assert out["test/bleu"] == 32.0 and out["test/bleu_std"] == 2.0
  assert (out["test/bleu_min"], out["test/bleu_max"]) == (30.0, 34.0)
  assert "eval/bleu" not in out and out["members/0/eval/bleu"] == 1.0


def test_traced_values_are_the_members_values_in_float32():
  pop = pl.Population.of(tiny_train_config(**FOUR))
  np.testing.assert_array_equal(pop.values["learning_rate"],
                                np.float32([3e-3, 1e-3, 5e-3, 2e-3]))
  assert set(pop.values) == {"learning_rate", "dropout_rate", "label_smoothing"}
  traced = pl.traced_config(pop.base, {"dropout_rate": 0.5})
  assert traced.model.dropout_rate == 0.5 and pop.base.model.dropout_rate == 0.1


def _unmixed(h: int) -> int:
  """The input that ops.dropout's murmur3 finalizer maps to `h` (it is a bijection)."""
  h ^= h >> 16
  h = h * pow(0xC2B2AE35, -1, 2 ** 32) % 2 ** 32
  h ^= (h >> 13) ^ (h >> 26)
  h = h * pow(0x85EBCA6B, -1, 2 ** 32) % 2 ** 32
  return h ^ (h >> 16)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_member_s_dropout_keeps_and_scales_as_its_run_alone_does(monkeypatch, dtype):
  """Each member's traced rate against the static rate of its run alone: the element whose
  random bits are the run's keep threshold is kept, one under it dropped, and a kept element
  is scaled by the same number."""
  rates = (0.0, 0.1, 1 / 3, 0.6)
  member_rates = pl.Population.of(tiny_train_config(**{"population.dropout_rate": rates})
                                  ).values["dropout_rate"]
  x = jnp.full((2,), 1.7, dtype)

  def drop(rate, seeds):  # (seeds: the two words Dropout draws from its key)
    monkeypatch.setattr(jax.random, "bits", lambda *_: seeds)
    return Dropout(rate).apply({}, x, False, rngs={"dropout": jax.random.PRNGKey(0)})

  for i, rate in enumerate(rates):
    member = jax.tree_util.tree_map(lambda v, i=i: v[i], member_rates)
    threshold = round(rate * 2 ** 32)
    for bits in {max(threshold - 1, 0), threshold}:  # (element 0's: 0 ^ 0 mixes to 0)
      seeds = jnp.asarray([0, _unmixed(bits)], jnp.uint32)
      alone = np.asarray(drop(rate, seeds))
      assert (alone[0] != 0) == (bits >= threshold), (rate, bits)
      np.testing.assert_array_equal(jax.jit(drop)(member, seeds), alone, err_msg=str(rate))


def test_members_stopping_early_end_the_population_which_reruns_to_no_step(
    tfds_cache, tiny_tokenizer, tmp_path):
  """Patience 1: a validation that does not beat a member's best stops it; once none trains,
  the population ends (saved, each member's test run) and a rerun trains nothing."""
  overrides = {**ONE_LAYER, "population.seeds": 2, "population.program": "vmapped",
               "num_train_steps": 12, "eval_every_steps": 2, "log_every_steps": 2,
               "checkpoint_every_steps": 12, "early_stopping_patience": 1,
               "eval_max_sentences": 4, "optimizer.learning_rate": 1e-9}  # (BLEU stays put)
  final = train_in_process(tmp_path, tfds_cache, tiny_tokenizer, **overrides)
  for i in range(2):
    member = tmp_path / "members" / str(i)
    bleu_steps = [r["step"] for r in read_metrics(member) if "eval/bleu" in r]
    assert bleu_steps == [2, 4]  # (step 4 did not beat step 2: stopped there)
    assert checkpoint_steps(member) == [4]
    assert f"members/{i}/eval/bleu" in final
  assert checkpoint_steps(tmp_path) == [4]
  assert [r["population/active_members"] for r in read_metrics(tmp_path)
          if "population/active_members" in r] == [2.0, 2.0]
  train_in_process(tmp_path, tfds_cache, tiny_tokenizer, **overrides)  # (trains no step)
  assert checkpoint_steps(tmp_path) == [4]
