"""Sweep specs: valid specs load; bad ones fail with a message naming the key, before any
trial starts."""

import ml_collections
import pytest

from tests import helpers
from transformer_jax.cli import sweep as sweep_cli
from transformer_jax.config import search_space as sweep_spec
from transformer_jax.config.search_space import SweepError, choice, integer, loguniform, uniform
from transformer_jax.configs import default, tiny
from transformer_jax.configs.sweeps import default_tpe, recipe_tpe, tiny_lr_warmup
from transformer_jax.sweeps import study


def _spec(**fields):
  spec = sweep_spec.new_spec()
  spec.search_space = {"optimizer": {"learning_rate": loguniform(1e-4, 1e-2)}}
  spec.num_trials = 4
  for key, value in fields.items():
    spec[key] = value
  return spec


def test_shipped_grid_spec_loads():
  spec = sweep_spec.load_spec(tiny_lr_warmup.get_config(), tiny.get_config())
  assert spec.direction == "minimize"          # eval/loss
  assert spec.intermediate_metric == "eval/loss"
  assert len(spec.grid_points) == 6
  assert spec.grid_points[0] == {"optimizer.learning_rate": 1e-2, "optimizer.warmup_steps": 5}
  assert spec.fixed["num_train_steps"] == 30


def test_ranges_and_overrides_as_config_flags_parse_them():
  base = tiny.get_config()
  spec = sweep_spec.load_spec(_spec(search_space={
      "optimizer": {"learning_rate": loguniform(1e-4, 1e-2), "warmup_steps": integer(1, 20)},
      "model": {"dropout_rate": uniform(0.0, 0.3), "pre_layer_norm": choice(True, False)}}), base)
  assert spec.direction == "maximize" and spec.sampler == "tpe"
  assert sweep_spec.format_override(base, "optimizer.learning_rate", 1e-3) == \
      "--config.optimizer.learning_rate=0.001"
  # An int given for a float field is written as a float; bools as config_flags reads them.
  assert sweep_spec.format_override(base, "model.dropout_rate", 0) == \
      "--config.model.dropout_rate=0.0"
  assert sweep_spec.format_override(base, "model.pre_layer_norm", False) == \
      "--config.model.pre_layer_norm=false"


@pytest.mark.parametrize("fields, message", [
    ({"search_space": {"optimizer": {"learnin_rate": loguniform(1e-4, 1e-2)}}},
     "sweep.search_space.optimizer.learnin_rate: config.optimizer has no key 'learnin_rate' "
     "(did you mean learning_rate?) (in the training config)"),
    ({"search_space": {"optimiser": {"learning_rate": choice(1e-3)}}},
     "config has no key 'optimiser' (did you mean optimizer?)"),
    ({"search_space": {}}, "sweep.search_space is empty"),
    ({"search_space": {"optimizer": {"learning_rate": choice("fast", "slow")}}},
     "value 'fast' has type str, but config.optimizer.learning_rate is float"),
    ({"search_space": {"optimizer": {"warmup_steps": uniform(1, 100)}}},
     "value 1.0 has type float, but config.optimizer.warmup_steps is int"),
    ({"search_space": {"optimizer": {"learning_rate": 1e-3}}}, "is a single value"),
    ({"search_space": {"optimizer": {"learning_rate": choice()}}}, "at least one value"),
    ({"search_space": {"optimizer": {"learning_rate": loguniform(0.0, 1e-2)}}},
     "log-scaled range needs low > 0"),
    ({"search_space": {"optimizer": {"learning_rate": uniform(1e-2, 1e-3)}}}, "low < high"),
    ({"search_space": {"model": {"num_heads": choice(3, 4)}}, "sampler": "grid",
      "num_trials": 0}, "grid point {'model.num_heads': 3}: the training config would be "
     "invalid"),
    ({"sampler": "grid"}, "continuous range; a grid sweep needs choice"),
    ({"sampler": "annealing"}, "sweep.sampler='annealing'; choose one of"),
    ({"objective": "eval/accuracy"}, "sweep.objective='eval/accuracy' is not a logged metric"),
    ({"objective": "test/bleu"}, "needs a test split"),
    ({"num_trials": 0}, "needs a budget >= 1"),
    ({"fixed": {"optimizer": {"learning_rate": 1e-3}}}, "both set optimizer.learning_rate"),
    ({"start_points": ({"optimizer": {"warmup_steps": 10}},)},
     "sweep.start_points[0]: optimizer.warmup_steps is not in sweep.search_space"),
    ({"start_points": ({"optimizer": {"learning_rate": 0.5}},)},
     "sweep.start_points[0].optimizer.learning_rate=0.5 is outside its search range"),
    ({"start_points": ({"optimizer": {"learning_rate": 1e-3}},) * 5},
     "holds 5 points but sweep.num_trials=4"),
    ({"sampler": "random", "search_space": {"optimizer": {"warmup_steps": choice(5, 10)}}},
     "sweep.num_trials=4 but the search space has 2 points"),
])
def test_bad_specs_are_rejected_with_the_key(fields, message):
  with pytest.raises(SweepError) as e:
    sweep_spec.load_spec(_spec(**fields), tiny.get_config())
  assert message in str(e.value)


def test_unknown_and_ill_typed_sweep_keys():
  spec = _spec()
  spec.unlock()
  spec.num_trails = 3
  with pytest.raises(SweepError, match=r"unknown key sweep.num_trails \(did you mean "
                                       r"num_trials\?\)"):
    sweep_spec.load_spec(spec, tiny.get_config())
  ill_typed = ml_collections.ConfigDict({**_spec().to_dict(), "num_trials": "many"})
  with pytest.raises(SweepError, match="sweep.num_trials='many' has type str"):
    sweep_spec.load_spec(ill_typed, tiny.get_config())


def test_cli_rejects_a_bad_spec_before_any_trial(tmp_path):
  bad = tmp_path / "bad.py"
  bad.write_text("from transformer_jax.config.search_space import choice, new_spec\n"
                 "def get_config():\n"
                 "  s = new_spec()\n"
                 "  s.sampler = 'grid'\n"
                 "  s.search_space = {'optimizer': {'learnin_rate': choice(1e-3, 1e-2)}}\n"
                 "  return s\n")
  status, _, err = helpers.run_tool(sweep_cli.main, "--config=configs/tiny.py", f"--sweep={bad}",
                                    f"--workdir={tmp_path / 'sweep'}")
  line = helpers.one_line_error(err)
  assert status == 2 and line.startswith(f"config error: sweep spec {bad}: ")
  assert "config.optimizer has no key 'learnin_rate'" in line
  assert not (tmp_path / "sweep").exists()  # no study, no trial


def test_trials_share_the_tokenizer_only_when_nothing_changes_it():
  base = tiny.get_config()
  assert sweep_spec.shares_tokenizer(sweep_spec.load_spec(_spec(), base), base)
  vocab = _spec(search_space={"model": {"vocab_size": choice(400, 500)}})
  assert not sweep_spec.shares_tokenizer(sweep_spec.load_spec(vocab, base), base)
  seed = _spec(fixed={"seed": 3})
  assert not sweep_spec.shares_tokenizer(sweep_spec.load_spec(seed, base), base)


def test_shipped_tpe_spec_loads_against_the_default_config():
  spec = sweep_spec.load_spec(default_tpe.get_config(), default.get_config())
  assert spec.sampler == "tpe" and spec.num_trials == 20 and spec.direction == "maximize"
  assert set(spec.search_space) == {"optimizer.learning_rate", "optimizer.warmup_steps",
                                    "model.dropout_rate", "label_smoothing"}


def test_a_sweep_of_a_planned_length_is_refused_and_a_fixed_one_loads():
  spec = default_tpe.get_config()
  assert sweep_spec.load_spec(spec, default.get_config()).fixed["num_train_steps"] == 1200
  del spec.fixed["num_train_steps"]  # (the default config plans its length: 0)
  with pytest.raises(SweepError, match=r"config.num_train_steps=0 \(a length planned .* "
                                       r"set sweep.fixed.num_train_steps"):
    sweep_spec.load_spec(spec, default.get_config())


def test_start_points_are_the_first_trials_and_the_others_are_sampled(tmp_path):
  spec = sweep_spec.load_spec(_spec(start_points=({"optimizer": {"learning_rate": 3e-3}},)),
                              tiny.get_config())
  storage = study.open_storage(f"sqlite:///{tmp_path / 'study.db'}", 60, 120, 2)
  opened = study.open_study(storage, "s", spec, spec.to_json())
  rates = []
  for _ in range(spec.num_trials):
    trial, _ = study.claim_next_trial(opened, storage, opened._study_id, spec)
    rates.append(trial.suggest_float("optimizer.learning_rate", 1e-4, 1e-2, log=True))
  assert rates[0] == 3e-3 and len(set(rates)) == 4


def test_shipped_recipe_spec_starts_from_the_modern_recipe():
  spec = sweep_spec.load_spec(recipe_tpe.get_config(), default.get_config())
  start, *variants = spec.start_points
  assert set(start) == set(spec.search_space)  # (the whole recipe, nothing sampled)
  assert start["model.positional_encoding"] == "rotary" and spec.fixed["data.test_split"] == ""
  for point in variants:  # (one change at a time)
    assert len([k for k in start if point[k] != start[k]]) == 1, point


def test_a_random_sweep_of_a_finite_space_runs_no_point_twice(tmp_path):
  """Six points, six trials: each once, in an order the seed decides (claimed as any trial)."""
  fields = dict(sampler="random", num_trials=6, seed=3, search_space={"optimizer": {
      "learning_rate": choice(1e-3, 3e-3, 1e-2), "warmup_steps": integer(5, 10, step=5)}})
  spec = sweep_spec.load_spec(_spec(**fields), tiny.get_config())
  storage = study.open_storage(f"sqlite:///{tmp_path / 'study.db'}", 60, 120, 2)
  opened = study.open_study(storage, "s", spec, spec.to_json())
  points = []
  for _ in range(spec.num_trials):
    trial, _ = study.claim_next_trial(opened, storage, opened._study_id, spec)
    points.append((trial.suggest_categorical("optimizer.learning_rate", (1e-3, 3e-3, 1e-2)),
                   trial.suggest_int("optimizer.warmup_steps", 5, 10, step=5)))
  assert sorted(points) == sorted((p["optimizer.learning_rate"], p["optimizer.warmup_steps"])
                                  for p in spec.grid_points)
  other = sweep_spec.load_spec(_spec(**{**fields, "seed": 4}), tiny.get_config())
  assert other.queued_points() != spec.queued_points()  # (the order: the seed's)
  # A start point that leaves a field out: a whole point of the grid, none queued twice.
  partial = sweep_spec.load_spec(_spec(**fields, start_points=(
      {"optimizer": {"learning_rate": 3e-3}},)), tiny.get_config())
  queued = partial.queued_points()
  assert queued[0]["optimizer.learning_rate"] == 3e-3 and len(queued[0]) == 2
  assert sorted(map(str, queued)) == sorted(map(str, spec.grid_points))


def test_a_population_sweep_shares_what_members_cannot_vary():
  spec = sweep_spec.load_spec(_spec(population=4, search_space={
      "optimizer": {"learning_rate": loguniform(1e-4, 1e-2), "grad_clip_norm": choice(0.0, 1.0),
                    "ema_decay": uniform(0.9, 0.999)},
      "model": {"dropout_rate": uniform(0.0, 0.3), "pre_layer_norm": choice(True, False)}}),
      tiny.get_config())
  assert set(spec.member_paths) == {"optimizer.learning_rate", "optimizer.ema_decay",
                                    "model.dropout_rate"}
  # (clipping off (0) is another program; pre_layer_norm another model)
  assert set(spec.shared_paths) == {"optimizer.grad_clip_norm", "model.pre_layer_norm"}
  assert spec.to_json()["population"] == 4
  assert "population" not in sweep_spec.load_spec(_spec(), tiny.get_config()).to_json()


@pytest.mark.parametrize("fields, base_population, message", [
    ({"population": 0}, {}, r"sweep.population=0 must be >= 1"),
    ({"population": 2}, {"seeds": 3}, r"the training config is a population already"),
    ({"population": 2, "fixed": {"population": {"dropout_rate": (0.1, 0.2)}}}, {},
     r"sweep.fixed.population.dropout_rate: with sweep.population the sweep gives each member"),
    ({"population": 2, "search_space": {"model": {"pre_layer_norm": choice(True, False)}}}, {},
     r"sweep.population=2, but no swept key can differ between members \(the shared ones: "
     r"model.pre_layer_norm\)"),
])
def test_bad_population_sweeps_are_one_line(fields, base_population, message):
  base = tiny.get_config()
  base.population.update(base_population)
  with pytest.raises(SweepError, match=message):
    sweep_spec.load_spec(_spec(**fields), base)


def test_population_claims_group_trials_by_their_shared_values(tmp_path):
  """A grid of 2 pre_layer_norm x 3 learning rates in populations of 4: each population
  holds one pre_layer_norm value (3 trials each), and every point is claimed once."""
  spec = sweep_spec.load_spec(_spec(population=4, sampler="grid", num_trials=0, search_space={
      "optimizer": {"learning_rate": choice(1e-3, 3e-3, 1e-2)},
      "model": {"pre_layer_norm": choice(True, False)}}), tiny.get_config())
  storage = study.open_storage(f"sqlite:///{tmp_path / 'study.db'}", 60, 120, 2)
  opened = study.open_study(storage, "s", spec, spec.to_json())
  groups = []
  while claimed := study.claim_population(opened, storage, opened._study_id, spec):
    groups.append([params for _, _, params in claimed])
  assert [len(g) for g in groups] == [3, 3]
  for group in groups:
    assert len({p["model.pre_layer_norm"] for p in group}) == 1
  assert sorted(map(str, (p for g in groups for p in g))) == sorted(map(str, spec.grid_points))


def test_population_claims_draw_shared_values_once(tmp_path):
  """TPE over a shared and a member key: each population's members take its first draw of
  the shared key and draw their own learning rates."""
  spec = sweep_spec.load_spec(_spec(population=3, num_trials=6, search_space={
      "optimizer": {"learning_rate": loguniform(1e-4, 1e-2)},
      "model": {"ffn_activation": choice("relu", "gelu")}}), tiny.get_config())
  storage = study.open_storage(f"sqlite:///{tmp_path / 'study.db'}", 60, 120, 2)
  opened = study.open_study(storage, "s", spec, spec.to_json())
  for _ in range(2):
    params = [p for _, _, p in study.claim_population(opened, storage, opened._study_id, spec)]
    assert len(params) == 3 and len({p["model.ffn_activation"] for p in params}) == 1
    assert len({p["optimizer.learning_rate"] for p in params}) == 3
  assert study.claim_population(opened, storage, opened._study_id, spec) == []
