"""A population's command: members' values as config.population tuples, shared values once;
a member's own command trains it alone in its population's batch order."""

from transformer_jax.config import search_space as sweep_spec
from transformer_jax.config.search_space import choice, loguniform
from transformer_jax.configs import tiny
from transformer_jax.sweeps.trials import TRAIN, TrialRunner


def test_a_population_command_and_its_members_commands(tmp_path):
  spec = sweep_spec.new_spec()
  spec.population, spec.num_trials = 2, 4
  spec.search_space = {"optimizer": {"learning_rate": loguniform(1e-4, 1e-2)},
                       "seed": choice(1, 2, 3), "model": {"pre_layer_norm": choice(True, False)}}
  spec.fixed = {"num_train_steps": 6}
  base = tiny.get_config()
  base.seed = 7
  spec = sweep_spec.load_spec(spec, base)
  runner = TrialRunner(None, None, spec, ["--config=configs/tiny.py"], base, tmp_path, "", 10)
  members = [{"optimizer.learning_rate": 1e-3, "seed": 1, "model.pre_layer_norm": False},
             {"optimizer.learning_rate": 3e-3, "seed": 3, "model.pre_layer_norm": False}]
  cmd = runner.population_command(members, tmp_path / "populations" / "0000")
  assert cmd[:len(TRAIN)] == TRAIN
  assert sorted(cmd[len(TRAIN):]) == sorted([
      "--config=configs/tiny.py", "--config.num_train_steps=6",
      "--config.model.pre_layer_norm=false", "--config.population.learning_rate=(0.001,0.003,)",
      "--config.population.seed=(1,3,)", f"--workdir={tmp_path / 'populations' / '0000'}"])
  # Member 1 alone: its own seed, the population's data order (the base config's seed).
  alone = runner.command(members[1], tmp_path / "alone")
  assert "--config.seed=3" in alone and alone[-2:] == ["--config.data_seed=7",
                                                        f"--workdir={tmp_path / 'alone'}"]
